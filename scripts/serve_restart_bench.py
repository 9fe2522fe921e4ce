#!/usr/bin/env python3
# scripts/serve_restart_bench.py TIERKV MODEL [TOKENS] [THREADS]
#
# Time to first token of a conversation's third turn, whose first turn holds a long
# document (about TOKENS tokens):
#   - tierkv serve --session-dir, killed with SIGKILL after turn 2 and started again
#     (the conversation restored from its session file, only turn 3 computed);
#   - tierkv serve without a session (every token of the conversation computed again);
#   - llama-server (scripts/llama_xcheck/build_server.sh, in $XC, default
#     /tmp/tierkv-xcheck) started afresh, as after a restart: the same prompt text
#     through /completion, streamed, to its first token;
#   - llama.cpp's library (scripts/llama_xcheck/llama_decode in $XC) prefilling the same
#     text in batches of 512 and computing the first token.
# Prints one markdown table. docs/benchmarks.md, "Server".
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "runtime", "server"))
import requests  # noqa: E402
from serverlib import Server  # noqa: E402

binary, model = sys.argv[1:3]
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
threads = sys.argv[4] if len(sys.argv) > 4 else "2"
xc = os.environ.get("XC", "/tmp/tierkv-xcheck")
shared = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")
p3 = json.load(open(os.path.join(shared, "reference", "vectors", "ref-llama-f16.json")))["cases"][-1]["prompt"]
document = (p3 * (1 + tokens // 2500))[: tokens * 4]
ctx = str(tokens * 2 + 1024)


def start(session_dir):
    return Server(binary, model, session_dir=session_dir, slots=2, ctx=ctx, ram="auto", frame="auto", threads=threads)


def first_token(server, history):
    """Streams turn `history`; returns (seconds to the first content, final chunk)."""
    body = {"messages": [{"role": a, "content": c} for a, c in history], "max_tokens": 8, "temperature": 0,
            "stream": True}
    t0 = time.perf_counter()
    ttft, last, text = None, None, ""
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[6:])
            except ValueError:
                print("bad line:", repr(line[:300]), file=sys.stderr)
                raise
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += chunk["choices"][0]["delta"]["content"]
            if "timings" in chunk:
                last = chunk
    return ttft, last, text


def turn(server, history, user):
    history.append(("user", user))
    r = server.post("/v1/chat/completions", {"messages": [{"role": a, "content": c} for a, c in history],
                                             "max_tokens": 16, "temperature": 0})
    r.raise_for_status()
    history.append(("assistant", r.json()["choices"][0]["message"]["content"]))
    return r.json()


work = tempfile.mkdtemp(prefix="tierkv-restart-bench-")
history = [("system", "You answer questions about the document the user gives.")]
s = start(os.path.join(work, "sessions"))
t1 = turn(s, history, "Here is a document:\n" + document + "\nSummarize it.")
turn(s, history, "Who is the main character?")
s.kill()
history.append(("user", "And what does the lighthouse keeper do at night?"))
t0 = time.perf_counter()
s = start(os.path.join(work, "sessions"))
start_s = time.perf_counter() - t0
restored_ttft, restored_last, restored_text = first_token(s, history)
print("restored: TTFT %.2f s, %s" % (restored_ttft, restored_last["timings"]), file=sys.stderr)
prompt_text = s.post("/apply-template", {"messages": [{"role": a, "content": c} for a, c in history]}).json()["prompt"]
s.term()

s = start(None)
cold_ttft, cold_last, cold_text = first_token(s, history)
print("re-prefill: TTFT %.2f s, %s" % (cold_ttft, cold_last["timings"]), file=sys.stderr)
s.term()

llama = None
dec = os.path.join(xc, "llama_decode")
backend = os.path.join(xc, "pkg", "package", "bins", "linux-x64", "libggml-cpu-zen4.so")
if os.path.exists(dec):
    out = subprocess.run([dec, backend, model, prompt_text, "1", threads], capture_output=True, text=True)
    if out.returncode == 0:
        llama = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        print("llama_decode failed:", out.stderr[-500:], file=sys.stderr)

server_ttft = None
server_bin = os.path.join(xc, "llama-server-build", "bin", "llama-server")
if os.path.exists(server_bin):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([server_bin, "-m", model, "-c", ctx, "-t", threads, "--port", str(port), "-np", "1",
                             "--no-webui"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = "http://127.0.0.1:%d" % port
        for _ in range(600):
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        t0 = time.perf_counter()
        with requests.post(url + "/completion", json={"prompt": prompt_text, "n_predict": 8, "temperature": 0,
                                                      "stream": True}, stream=True, timeout=3600) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data: ") and json.loads(line[6:]).get("content"):
                    server_ttft = time.perf_counter() - t0
                    break
    finally:
        proc.terminate()
        proc.wait()

u = restored_last["usage"]
print("turn 3: %d prompt tokens (turn 1: %d)" % (u["prompt_tokens"], t1["usage"]["prompt_tokens"]))
print("server start after SIGKILL (model load, session index): %.2f s" % start_s)
print()
print("| turn 3 time to first token | prompt tokens computed | TTFT |")
print("|---|---|---|")
print("| tierkv serve, restarted, session restored | %d (%d reused) | %.2f s |"
      % (restored_last["timings"]["prompt_n"], restored_last["timings"]["cache_n"], restored_ttft))
print("| tierkv serve, no session (re-prefill) | %d | %.2f s |" % (cold_last["timings"]["prompt_n"], cold_ttft))
if server_ttft is not None:
    print("| llama-server, restarted (no slot file: the whole prompt again) | %d | %.2f s |"
          % (u["prompt_tokens"], server_ttft))
if llama:
    print("| llama.cpp (libllama, batches of 512), re-prefill + first token | %d | %.2f s |"
          % (llama["prompt_tokens"], llama["prefill_s"] + llama["decode_s"]))
print()
print("same reply text restored vs recomputed:", restored_text == cold_text)
