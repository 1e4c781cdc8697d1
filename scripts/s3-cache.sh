#!/usr/bin/env bash
# The cache's S3 remote against a REAL S3-protocol server: moto's server (moto[server] from
# PyPI) on loopback, with authentication on, so that wrong credentials are refused as S3 would.
#
#   bash scripts/s3-cache.sh          # install what is missing, run cargo-promptgen/tests/it/s3_cache.rs
#   bash scripts/s3-cache.sh bench    # the same server for `cargo bench -p cargo-promptgen -- cache`
#
# Everything lives under target/s3-cache/ and is reused by later runs:
#   venv/     moto[server] (and boto3, which it brings), pinned
#   moto.log  the server's log
#
# The server starts with INITIAL_NO_AUTH_ACTION_COUNT=3: the three IAM calls that create a user,
# its policy and its access key go through unauthenticated; every request after them must be
# signed with that key. The tests get the endpoint, the bucket and the key in PROMPTGEN_S3_*.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

MOTO_VERSION=5.2.5
BUCKET=promptgen-test

root="$repo/target/s3-cache"
venv="$root/venv"
python="$venv/bin/python"
log="$root/moto.log"

say() { echo "s3-cache.sh: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

ensure_moto() {
    if [ -x "$python" ] && [ "$("$python" -c 'import moto; print(moto.__version__)' 2>/dev/null)" = "$MOTO_VERSION" ]; then
        return
    fi
    say "installing moto[server] $MOTO_VERSION into $venv (about two minutes)"
    rm -rf "$venv"
    python3 -m venv "$venv" || fail "python3 -m venv could not create $venv. No test ran."
    "$venv/bin/pip" install --quiet --no-cache-dir "moto[server]==$MOTO_VERSION" \
        || fail "pip could not install moto[server]==$MOTO_VERSION: is PyPI reachable? No test ran."
}

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

SERVER_PID=""
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
}

# Starts moto on a free loopback port and waits until it accepts connections (a TCP connect,
# not a request: requests before the setup's would use up the unauthenticated ones).
start_server() {
    local port
    port="$(free_port)"
    mkdir -p "$root"
    INITIAL_NO_AUTH_ACTION_COUNT=3 "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
    SERVER_PID=$!
    ENDPOINT="http://127.0.0.1:$port"
    local deadline=$((SECONDS + 60))
    until "$python" -c "import socket; socket.create_connection(('127.0.0.1', $port), timeout=1)" 2>/dev/null; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            tail -n 20 "$log" >&2
            fail "moto_server exited before it answered"
        fi
        [ $SECONDS -lt $deadline ] || { tail -n 20 "$log" >&2; fail "moto_server did not answer at $ENDPOINT within a minute"; }
        sleep 0.2
    done
}

# Creates the IAM user, its key and the bucket; sets KEY_ID and SECRET.
setup_server() {
    local keys
    keys="$("$python" - "$ENDPOINT" "$BUCKET" <<'EOF'
import json, sys
import boto3
endpoint, bucket = sys.argv[1], sys.argv[2]
plain = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam = boto3.client("iam", **plain)
iam.create_user(UserName="promptgen")
iam.put_user_policy(UserName="promptgen", PolicyName="cache", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="promptgen")["AccessKey"]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
s3.create_bucket(Bucket=bucket)
print(key["AccessKeyId"], key["SecretAccessKey"])
EOF
    )" || { tail -n 20 "$log" >&2; fail "could not create the test user and bucket on moto"; }
    read -r KEY_ID SECRET <<<"$keys"
}

ensure_moto
trap stop_server EXIT INT TERM
start_server
setup_server
say "moto $MOTO_VERSION at $ENDPOINT, bucket $BUCKET, authentication on"
export PROMPTGEN_S3_ENDPOINT="$ENDPOINT" PROMPTGEN_S3_BUCKET="$BUCKET" \
    PROMPTGEN_S3_KEY_ID="$KEY_ID" PROMPTGEN_S3_SECRET="$SECRET"

if [ "${1:-}" = bench ]; then
    shift
    cargo bench -p cargo-promptgen --bench promptgen -- cache "$@"
    exit
fi

out="$root/tests.log"
status=0
cargo test -p cargo-promptgen --test it s3_cache:: -- --ignored --test-threads=1 2>&1 | tee "$out" || status=$?
[ "$status" -eq 0 ] || fail "the S3 cache suite failed (its log: $out; the server's: $log)"
passed="$(grep -Eo 'test result: ok\. [0-9]+ passed' "$out" | tail -n 1 | grep -Eo '[0-9]+' | head -n 1 || true)"
[ "${passed:-0}" -gt 0 ] || fail "no S3 cache test ran"
say "S3 cache suite against moto $MOTO_VERSION: $passed passed"
