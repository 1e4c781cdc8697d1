#!/usr/bin/env bash
# The page of `cargo promptgen log --html`, as a browser shows it: records a small chain against
# the fake LLM server (a repair, a refused tool call and a failed check among its turns), writes
# the page, opens it in headless Chromium (Debian's `chromium`), takes a screenshot and dumps
# the DOM, and checks both: the DOM holds every step and no script element, and the screenshot,
# read back by OCR (Debian's `tesseract-ocr`), shows every step's id. Either package is
# installed here when missing (as root, through apt-get), so running it twice is the same as
# once. No network: the page loads nothing, and Chromium is started with everything that would
# call home turned off.
#
#   scripts/html-report.sh            # writes target/html-report/{chain.html,chain.png,dom.html,ocr.txt}
#   scripts/html-report.sh docs       # also copies the screenshot to docs/log-html.png
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/html-report"

fail() {
    echo "html-report: $*" >&2
    exit 1
}

# Installs the Debian package $2 unless the command $1 is there.
need() {
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        fail "\`$1\` is missing; install Debian's \`$2\` (apt-get install $2) or run this as root on Debian"
    fi
    echo "html-report: installing Debian's $2"
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "${apt_updated:-}" ]; then
        apt-get update -qq >"$out/apt.log" 2>&1 || fail "apt-get update failed (see $out/apt.log)"
        apt_updated=1
    fi
    apt-get install -y -qq "$2" ${3:-} >>"$out/apt.log" 2>&1 || fail "apt-get install $2 failed (see $out/apt.log)"
    command -v "$1" >/dev/null 2>&1 || fail "\`$1\` is still missing after installing $2"
}

rm -rf "$out"
mkdir -p "$out"
need chromium chromium fonts-dejavu-core
need tesseract tesseract-ocr

# The chain and its page: the `html_report_page` test writes them where this says.
PROMPTGEN_HTML_REPORT="$out/chain.html" cargo test --quiet -p cargo-promptgen --test it -- \
    --ignored --exact watching::html_report_page
test -s "$out/chain.html" || fail "the test wrote no page at $out/chain.html"

shoot() {
    # A new, empty profile each time; nothing that talks to the network in the background.
    local profile status=0
    profile="$(mktemp -d)"
    timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --disable-default-apps --disable-extensions --no-default-browser-check \
        --user-data-dir="$profile" "$@" 2>>"$out/chromium.log" || status=$?
    rm -rf "$profile"
    [ "$status" = 0 ] || fail "chromium failed ($status); see $out/chromium.log"
}

shoot --window-size=1200,1500 --screenshot="$out/chain.png" "file://$out/chain.html"
shoot --dump-dom "file://$out/chain.html" >"$out/dom.html"

# The screenshot: a PNG as big as the window asked for.
test -s "$out/chain.png" || fail "chromium wrote no screenshot"
python3 - "$out/chain.png" <<'PY' || fail "the screenshot is not a 1200x1500 PNG"
import struct, sys
data = open(sys.argv[1], "rb").read(32)
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (1200, 1500), (width, height)
print(f"html-report: screenshot {width}x{height}")
PY
# ... that shows the chain: OCR must read each step's id in it (a blank or broken page has none).
tesseract "$out/chain.png" "$out/ocr" >/dev/null 2>&1 || fail "tesseract could not read the screenshot"
for step in 'step 01' 'step 02' 'step 03' 'prompt chain'; do
    grep -qF -- "$step" "$out/ocr.txt" || fail "the screenshot does not show \`$step\` (OCR read: $out/ocr.txt)"
done

# The rendered DOM: every step, the graph, the failed check, and the model's markup as text.
for wanted in 'id="step-01"' 'id="step-02"' 'id="step-03"' '>step 01</text>' '>step 03</text>' \
    'check failed' '&lt;script&gt;'; do
    grep -qF -- "$wanted" "$out/dom.html" || fail "the rendered page lacks $wanted"
done
# The browser ran no script of the model's: the text is still text in the rendered DOM.
if grep -q '<script' "$out/dom.html"; then
    fail "the rendered page holds a script element"
fi

if [ "${1:-}" != "" ]; then
    mkdir -p "$1"
    cp "$out/chain.png" "$1/log-html.png"
    echo "html-report: copied the screenshot to $1/log-html.png"
fi
echo "html-report: ok ($out)"
