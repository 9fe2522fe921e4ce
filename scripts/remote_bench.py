#!/usr/bin/env python3
# scripts/remote_bench.py TIERKV MODEL [TOKENS] [THREADS]
#
# Two `tierkv serve` processes (separate session dirs and disk tiers) sharing one Redis
# (a redis-server of its own on a unix socket): server A computes a prompt of about
# TOKENS tokens and publishes its blocks; server B then gets the same prompt and
# fetches them. Time to first token (streamed) of B against server C (no remote: the
# whole prompt computed), and the three answers compared (temperature 0, 8 tokens).
# Prints one markdown table. docs/benchmarks.md, "Remote tier".
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "runtime", "server"))
import requests  # noqa: E402
from serverlib import Server  # noqa: E402

binary, model = sys.argv[1:3]
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
threads = sys.argv[4] if len(sys.argv) > 4 else "2"
shared = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")
p3 = json.load(open(os.path.join(shared, "reference", "vectors", "ref-llama-f16.json")))["cases"][-1]["prompt"]
ctx = str(tokens + 256)  # room for the 8 tokens generated


def metric(server, name):
    text = server.get("/metrics").text
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def first_token(server, prompt):
    """Streams /completion: (seconds to the first token, the text, the final timings)."""
    t0 = time.perf_counter()
    ttft = None
    text = ""
    timings = {}
    with requests.post(server.url + "/completion", stream=True, timeout=3600,
                       json={"prompt": prompt, "n_predict": 8, "temperature": 0, "stream": True,
                             "cache_prompt": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            frame = json.loads(line[6:])
            if ttft is None and frame.get("content"):
                ttft = time.perf_counter() - t0
            text += frame.get("content", "")
            timings = frame.get("timings", timings)
    return ttft if ttft is not None else time.perf_counter() - t0, text, timings


work = tempfile.mkdtemp(prefix="tierkv-remote-bench-")
sock = os.path.join(work, "redis.sock")
redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
                          "--save", "", "--appendonly", "no", "--dir", work, "--maxmemory", "8gb",
                          "--maxmemory-policy", "allkeys-lru", "--logfile", os.path.join(work, "redis.log")])
try:
    for _ in range(500):
        if os.path.exists(sock):
            break
        time.sleep(0.01)
    # Warmed up (frames touched before use) as a server is by default; slots=2: the warm-up
    # request below keeps its own slot.
    common = dict(slots=2, ctx=ctx, ram="auto", frame="auto", threads=threads, warmup=True)
    remote = ["--remote", "unix://" + sock]
    def own(name):  # each server its own session dir and disk tier
        os.makedirs(os.path.join(work, name + "-disk"))
        return dict(session_dir=os.path.join(work, name),
                    extra=remote + ["--disk", "2GiB", "--disk-dir", os.path.join(work, name + "-disk")])

    a = Server(binary, model, **own("a"), **common)
    b = Server(binary, model, **own("b"), **common)
    # The document: a prompt of about `tokens` tokens (counted by the model's tokenizer).
    doc = p3
    while len(a.post("/tokenize", {"content": doc}).json()["tokens"]) < tokens:
        doc += " " + doc
    ids = a.post("/tokenize", {"content": doc}).json()["tokens"][:tokens]
    prompt = ids  # token ids: the same prompt for every server, exactly `tokens` long
    # Servers that have served before (weights paged in): one short request each first.
    for s in (a, b):
        first_token(s, "Hello")
    a_s, a_text, a_t = first_token(a, prompt)
    for _ in range(6000):
        if metric(a, "tierkv_remote_pending_bytes") == 0 and metric(a, "tierkv_remote_published_blocks_total"):
            break
        time.sleep(0.05)
    published = metric(a, "tierkv_remote_published_blocks_total")
    used = subprocess.run(["redis-cli", "-s", sock, "info", "memory"], capture_output=True, text=True).stdout
    redis_bytes = int(re.search(r"used_memory:(\d+)", used).group(1))
    b_s, b_text, b_t = first_token(b, prompt)
    again_s, _, _ = first_token(b, prompt)
    print("B again, from its slot (the request's own cost): %.3f s" % again_s, file=sys.stderr)
    fetched = metric(b, "tierkv_remote_fetched_bytes_total")
    fetch_s = metric(b, "tierkv_remote_fetch_seconds_total")
    # A third server, once Redis has served a fetch (its reply buffers allocated: a
    # long-running cache's state; the first fetch from a fresh redis-server pays its
    # page faults).
    d = Server(binary, model, **own("d"), **common)
    first_token(d, "Hello")
    d_s, d_text, d_t = first_token(d, prompt)
    d_fetch_s = metric(d, "tierkv_remote_fetch_seconds_total")
    d.term()
    a.term()
    b.term()
    for line in b.log + d.log:
        if "remote cache in" in line:
            print(line.rstrip(), file=sys.stderr)
    c = Server(binary, model, session_dir=None, **common)
    first_token(c, "Hello")
    c_s, c_text, c_t = first_token(c, prompt)
    c.term()
finally:
    redis.kill()
    redis.wait()

print("| server | prompt tokens | computed | reused | time to first token | answer |")
print("|---|---:|---:|---:|---:|---|")
print("| A: computes, publishes to Redis | %d | %d | %d | %.2f s | %s |"
      % (len(prompt), a_t.get("prompt_n", -1), a_t.get("cache_n", -1), a_s, "reference"))
print("| B: fetches A's blocks from Redis | %d | %d | %d | **%.3f s** | %s |"
      % (len(prompt), b_t.get("prompt_n", -1), b_t.get("cache_n", -1), b_s, "same" if b_text == a_text else "DIFFERS"))
print("| D: the same, Redis warm (it served B) | %d | %d | %d | **%.3f s** | %s |"
      % (len(prompt), d_t.get("prompt_n", -1), d_t.get("cache_n", -1), d_s, "same" if d_text == a_text else "DIFFERS"))
print("| C: no remote (whole prompt) | %d | %d | %d | %.2f s | %s |"
      % (len(prompt), c_t.get("prompt_n", -1), c_t.get("cache_n", -1), c_s, "same" if c_text == a_text else "DIFFERS"))
print()
print("First token sooner than C's: B %.1fx, D %.1fx. Fetched %.1f MiB: B in %.3f s (%.0f MiB/s), D in %.3f s "
      "(%.0f MiB/s); %d blocks published, Redis used_memory %.1f MiB (%.2f KiB per prompt token)"
      % (c_s / b_s, c_s / d_s, fetched / 2**20, fetch_s, fetched / 2**20 / max(fetch_s, 1e-9), d_fetch_s,
         fetched / 2**20 / max(d_fetch_s, 1e-9), published, redis_bytes / 2**20, redis_bytes / 1024 / len(prompt)))
sys.exit(0 if a_text == b_text == c_text == d_text else 1)
