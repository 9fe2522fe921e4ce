#!/usr/bin/env bash
# tests/runtime/server/clients.sh TIERKV MODEL: `tierkv serve` on loopback driven by real
# clients (curl, Node's fetch, python3-requests), the SIGKILL restart test, the load
# test and two servers sharing a Redis (tests/runtime/server/*.py). Run by ctest (tests/CMakeLists.txt) when the three clients
# are installed (scripts/deps.sh installs them).
set -euo pipefail
bin=$1 model=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "clients.sh: $*" >&2; exit 1; }

# Refusals: one error line, exit 2 for usage, 1 for a model that does not load.
set +e
"$bin" serve -m "$model" --port 70000 2> "$work/err"; code=$?
set -e
[ "$code" = 2 ] && [ "$(wc -l < "$work/err")" = 1 ] && grep -q "^error: --port" "$work/err" || fail "bad --port: $code $(cat "$work/err")"
set +e
"$bin" serve -m "$work/missing.gguf" --port 0 2> "$work/err"; code=$?
set -e
[ "$code" = 1 ] && grep -q "^error: .*missing.gguf" "$work/err" && [ "$(grep -c '^error' "$work/err")" = 1 ] \
  || fail "missing model: $code $(cat "$work/err")"
set +e
"$bin" serve -m "$model" --port 0 -c 200000 --ram 64MiB --frame 64KiB --no-warmup 2> "$work/err"; code=$?
set -e
[ "$code" = 1 ] && grep -q "^error: impossible budget.*raise --ram" "$work/err" && ! grep -q -- "--host" "$work/err" \
  || fail "impossible budget: $code $(cat "$work/err")"
set +e
"$bin" run -m "$model" -p x -np 2 2> "$work/err"; code=$?
set -e
[ "$code" = 2 ] || fail "run -np: $code $(cat "$work/err")"

"$bin" serve -m "$model" --port 0 -c 512 -np 2 --ram 64MiB --frame 64KiB --no-warmup --mlock off -t 1 \
  --session-dir "$work" 2> "$work/log" &
pid=$!
for _ in $(seq 600); do grep -q "ready: http" "$work/log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
port=$(sed -n 's|.*ready: http://[^:]*:\([0-9]*\).*|\1|p' "$work/log")
[ -n "$port" ] || fail "server did not start: $(cat "$work/log")"
url=http://127.0.0.1:$port

# curl: whole and streamed chat, the llama.cpp endpoints.
body='{"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"temperature":0}'
curl -sf "$url/health" | grep -q '"ok"' || fail "health"
curl -sf "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" > "$work/whole.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["object"]=="chat.completion" and j["usage"]["completion_tokens"]==6, j' "$work/whole.json" \
  || fail "curl chat"
curl -sfN "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "${body%\}},\"stream\":true}" > "$work/stream.txt"
tail -n 2 "$work/stream.txt" | grep -q '^data: \[DONE\]$' || fail "curl stream: no [DONE]"
curl -sf "$url/completion" -d '{"prompt":"Once upon","n_predict":3,"temperature":0,"cache_prompt":true}' | grep -q '"stop":true' \
  || fail "curl /completion"
curl -sf "$url/tokenize" -d '{"content":"Hello world"}' | grep -q '"tokens"' || fail "curl /tokenize"
curl -sf "$url/slots" | grep -q '"tokens_cached"' || fail "curl /slots"
curl -sf "$url/props" | grep -q '"total_slots"' || fail "curl /props"
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/chat/completions" -d '{"messages": 5}')
[ "$code" = 400 ] || fail "curl bad request: $code"

# Node's fetch.
node "$here/client_test.mjs" "$url"

# python3-requests: cached_tokens equals the reused prefix; /metrics parses.
python3 - "$url" <<'PY' || fail "python client"
import sys, requests
url = sys.argv[1]
def chat(msgs, **kw):
    r = requests.post(url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0, **kw}, timeout=120)
    r.raise_for_status()
    return r.json()
first = chat([{"role": "user", "content": "Name a colour."}])
n1 = first["usage"]["prompt_tokens"]
# The same prompt again: all of it is reused but its last token.
again = chat([{"role": "user", "content": "Name a colour."}])
assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n1 - 1, again["usage"]
assert again["timings"]["prompt_n"] == 1, again["timings"]
assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
tok = requests.post(url + "/tokenize", json={"content": "Name a colour."}).json()["tokens"]
assert tok, tok
metrics = {}
for line in requests.get(url + "/metrics").text.splitlines():
    if line and not line.startswith("#"):
        k, v = line.rsplit(" ", 1)
        metrics[k] = float(v)
assert metrics["tierkv_prompt_tokens_cached_total"] >= n1 - 1, metrics
assert 'tierkv_tier_used_bytes{tier="host"}' in metrics
print("python client: ok")
PY
kill -TERM $pid
wait $pid || fail "SIGTERM: exit code $?"
pid=

python3 "$here/restart_test.py" "$bin" "$model" "$work"
python3 "$here/load_test.py" "$bin" "$model" "$work" 200 8 4
python3 "$here/remote_test.py" "$bin" "$model" "$work"
echo "clients.sh: all passed"
