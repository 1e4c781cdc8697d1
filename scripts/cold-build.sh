#!/usr/bin/env bash
# Cold build cost for a user (BENCHMARKS.md, figure 4).
#
# Builds a fresh throwaway crate that has cargo-promptgen as a build-dependency (a path
# dependency on this checkout) and really uses it: its build script materialises the
# example chain (prompts/ and example-app's lock and store, copied) offline, and its main
# mounts the generated modules. Every build starts from its own empty CARGO_TARGET_DIR, one
# after the other; the script prints the crates compiled and the wall time.
#
#   scripts/cold-build.sh                 # the three variants below, one after the other
#   scripts/cold-build.sh default         # only `cargo-promptgen = { path = ... }`
#   scripts/cold-build.sh online          # only `... default-features = false, features = ["online"]`
#                                         # (regenerates in `cargo build`, no TLS)
#   scripts/cold-build.sh offline         # only `... default-features = false` (copies the
#                                         # recorded files: no HTTP client, no model loop)
#   REPS=3 scripts/cold-build.sh          # each variant 3 times: median [min .. max]
#   KEEP=1 scripts/cold-build.sh          # keep the scratch folder (--timings reports)
#   VERBOSE=1 scripts/cold-build.sh       # also list the crates compiled
#
# The crate starts from the workspace's Cargo.lock, so it compiles the same versions the
# workspace does, and builds with --offline when the registry cache has them (it falls back
# to an online build otherwise). `cargo build --timings` writes an HTML report per build
# into <scratch>/target-<variant>-<n>/cargo-timings/.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(default online offline)
reps="${REPS:-1}"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/promptgen-cold-build.XXXXXX")"
if [ -z "${KEEP:-}" ]; then
    trap 'rm -rf "$scratch"' EXIT
fi

# The example's prompts sit beside the crate, as they sit beside example-app.
cp -r "$repo/prompts" "$scratch/prompts"
chain="$(sed -n '/^\[package.metadata.promptgen\]/,$p' "$repo/example-app/Cargo.toml")"

echo "seconds: median [min .. max] of $reps build(s) each"
printf '%-8s %7s %24s %24s  %s\n' variant crates "wall seconds" "CPU seconds" dependency
for variant in "${variants[@]}"; do
    case "$variant" in
        default) dep="cargo-promptgen = { path = \"$repo/cargo-promptgen\" }" ;;
        online) dep="cargo-promptgen = { path = \"$repo/cargo-promptgen\", default-features = false, features = [\"online\"] }" ;;
        offline) dep="cargo-promptgen = { path = \"$repo/cargo-promptgen\", default-features = false }" ;;
        *) echo "unknown variant \`$variant\`: expected default, online or offline" >&2; exit 2 ;;
    esac
    app="$scratch/app-$variant"
    mkdir -p "$app/src"
    {
        printf '[package]\nname = "cold-build-%s"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n' "$variant"
        printf '[build-dependencies]\n%s\n\n[workspace]\n\n%s\n' "$dep" "$chain"
    } >"$app/Cargo.toml"
    printf 'fn main() -> Result<(), cargo_promptgen::Error> {\n    cargo_promptgen::build()\n}\n' >"$app/build.rs"
    # The generated presenter uses example-app's hand-written names.rs, as example-app does.
    cp "$repo/example-app/src/names.rs" "$app/src/names.rs"
    printf '#[allow(dead_code)]\nmod names;\n\n#[allow(dead_code)]\nmod generated {\n    include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));\n}\n\nfn main() {}\n' >"$app/src/main.rs"
    cp "$repo/example-app/promptgen.lock" "$app/"
    cp -r "$repo/example-app/promptgen" "$app/"
    cp "$repo/Cargo.lock" "$app/Cargo.lock"
    offline=(--offline)
    if ! (cd "$app" && cargo fetch --offline >/dev/null 2>&1); then
        offline=()
    fi

    walls=()
    cpus=()
    crates=0
    log=""
    for rep in $(seq 1 "$reps"); do
        target="$scratch/target-$variant-$rep"
        log="$scratch/build-$variant-$rep.log"
        timing="$scratch/time-$variant-$rep"
        # Bash's `time` gives wall seconds, and the CPU seconds (user + system) of every
        # process the build ran: the second is less at the mercy of a busy machine.
        TIMEFORMAT='%R %U %S'
        if ! { time (cd "$app" && PROMPTGEN_OFFLINE=1 CARGO_TARGET_DIR="$target" cargo build "${offline[@]}" --timings >"$log" 2>&1); } 2>"$timing"; then
            cat "$log" >&2
            exit 1
        fi
        walls+=("$(awk '{ printf "%.1f", $1 }' "$timing")")
        cpus+=("$(awk '{ printf "%.1f", $2 + $3 }' "$timing")")
        crates=$(grep -c '^ *Compiling ' "$log" || true)
        if [ -z "${KEEP:-}" ]; then
            rm -rf "$target"
        fi
    done
    spread() {
        printf '%s\n' "$@" | sort -n | awk '
            { v[NR] = $1 }
            END {
                median = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                printf "%.1f [%.1f .. %.1f]", median, v[1], v[NR]
            }'
    }
    printf '%-8s %7s %24s %24s  %s\n' "$variant" "$crates" "$(spread "${walls[@]}")" "$(spread "${cpus[@]}")" "$dep"
    if [ -n "${VERBOSE:-}" ]; then
        grep '^ *Compiling ' "$log" | awk '{print $2}' | tr '\n' ' '
        echo
    fi
done
if [ -n "${KEEP:-}" ]; then
    echo "scratch folder kept: $scratch"
fi
