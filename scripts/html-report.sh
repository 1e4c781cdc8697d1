#!/usr/bin/env bash
# The page of `cargo promptgen log --html`, as a browser shows it: records a small chain against
# the fake LLM server (a repair, a refused tool call and a failed check among its turns), writes
# the page, opens it in headless Chromium (Debian's `chromium`, installed here when missing),
# takes a screenshot and dumps the DOM, and checks that both hold the steps. No network: the
# page loads nothing, and Chromium is started with everything that would call home turned off.
#
#   scripts/html-report.sh            # writes target/html-report/{chain.html,chain.png,dom.html}
#   scripts/html-report.sh docs/      # also copies the screenshot to docs/log-html.png
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/html-report"
rm -rf "$out"
mkdir -p "$out"

if ! command -v chromium >/dev/null 2>&1; then
    echo "html-report: installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi

# The chain and its page: the `html_report_page` test writes them where this says.
PROMPTGEN_HTML_REPORT="$out/chain.html" cargo test --quiet -p cargo-promptgen --test watching -- \
    --ignored --exact html_report_page

shoot() {
    # A new, empty profile each time; nothing that talks to the network in the background.
    local profile
    profile="$(mktemp -d)"
    timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --disable-default-apps --disable-extensions --no-default-browser-check \
        --user-data-dir="$profile" "$@" 2>"$out/chromium.log"
    rm -rf "$profile"
}

shoot --window-size=1200,1500 --screenshot="$out/chain.png" "file://$out/chain.html"
shoot --dump-dom "file://$out/chain.html" >"$out/dom.html"

test -s "$out/chain.png" || { echo "html-report: no screenshot" >&2; exit 1; }
# A PNG, as big as the window asked for.
python3 - "$out/chain.png" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read(32)
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (1200, 1500), (width, height)
print(f"html-report: screenshot {width}x{height}")
EOF
for wanted in 'id="step-01"' 'id="step-02"' '>step 01</text>' '>step 02</text>' 'check failed' '&lt;script&gt;'; do
    grep -qF -- "$wanted" "$out/dom.html" || { echo "html-report: the rendered page lacks $wanted" >&2; exit 1; }
done
# The browser ran no script of the model's: the text is still text in the rendered DOM.
if grep -q '<script' "$out/dom.html"; then
    echo "html-report: the rendered page holds a script element" >&2
    exit 1
fi
if [ "${1:-}" != "" ]; then
    mkdir -p "$1"
    cp "$out/chain.png" "$1/log-html.png"
    echo "html-report: copied the screenshot to $1/log-html.png"
fi
echo "html-report: ok ($out)"
