#!/usr/bin/env python3
# tests/runtime/server/remote_test.py TIERKV MODEL WORKDIR
#
# Two `tierkv serve --remote` processes (separate session dirs) sharing a redis-server
# of the test's own on a unix socket: a prompt server A computed is reused by server B
# (only its partial last block computed) with the same tokens; with Redis killed, a
# third server answers the same; a bad URL is one usage line.
import os
import re
import subprocess
import sys
import time

from serverlib import Server

binary, model, work = sys.argv[1:4]
work = os.path.join(work, "remote")
os.makedirs(work, exist_ok=True)
sock = os.path.join(work, "redis.sock")
bad = subprocess.run([binary, "serve", "-m", model, "--port", "0", "--remote", "http://x"], capture_output=True, text=True)
assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--remote" in bad.stderr, bad

redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                          "--appendonly", "no", "--dir", work, "--logfile", os.path.join(work, "redis.log")])
servers = []


def start(name):
    servers.append(Server(binary, model, session_dir=os.path.join(work, name), ctx=2048,
                          extra=["--remote", "unix://" + sock]))
    return servers[-1]


try:
    for _ in range(500):
        if os.path.exists(sock):
            break
        time.sleep(0.01)
    prompt = "".join("Entry %d: the lighthouse keeper counted %d ships before the storm. " % (i, i * 7 % 13)
                     for i in range(60))
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": True}

    def metric(server, name):
        m = re.search(r"^%s (\S+)$" % re.escape(name), server.get("/metrics").text, re.M)
        return float(m.group(1)) if m else None

    a = start("a")
    first = a.post("/completion", body).json()
    for _ in range(500):
        if metric(a, "tierkv_remote_pending_bytes") == 0:
            break
        time.sleep(0.01)
    assert metric(a, "tierkv_remote_published_blocks_total") >= 4, metric(a, "tierkv_remote_published_blocks_total")
    a.term()
    b = start("b")
    reused = b.post("/completion", body).json()
    assert reused["content"] == first["content"], (reused, first)
    n = reused["tokens_evaluated"]
    assert reused["timings"]["cache_n"] > n - 256 and reused["timings"]["prompt_n"] < 256, reused["timings"]
    assert metric(b, "tierkv_remote_hit_blocks_total") >= 4
    b.term()
    redis.kill()
    redis.wait()
    c = start("c")
    alone = c.post("/completion", body).json()
    assert alone["content"] == first["content"] and alone["timings"]["cache_n"] == 0, alone
    assert metric(c, "tierkv_remote_connected") == 0
    assert any("remote KV cache" in line and "computed" in line for line in c.log), c.log
    c.term()
finally:
    redis.kill()
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
print("remote_test: ok")
