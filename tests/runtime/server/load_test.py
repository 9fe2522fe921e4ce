#!/usr/bin/env python3
# tests/runtime/server/load_test.py TIERKV MODEL WORKDIR [REQUESTS] [CLIENTS] [SLOTS]
#
# Load on loopback: SLOTS slots, CLIENTS clients, REQUESTS requests drawn (fixed seed)
# from prompts with shared and distinct prefixes. Every answer must equal the same
# request run alone (temperature 0), with no errors, and the tiers' peak use within
# their budgets. Prints throughput and p50 / p99 latency.
import os
import random
import statistics
import sys
import threading
import time

from serverlib import Server

binary, model, work = sys.argv[1:4]
n_requests = int(sys.argv[4]) if len(sys.argv) > 4 else 200
n_clients = int(sys.argv[5]) if len(sys.argv) > 5 else 8
n_slots = int(sys.argv[6]) if len(sys.argv) > 6 else 4

systems = ["You are a helpful assistant who answers in one sentence. " * 4,
           "You are a pirate. Speak like one, always, whatever you are asked. " * 3,
           "You translate English into French, word for word, and nothing else. " * 3]
questions = ["What is a lighthouse?", "Why is the sea salty?", "Tell me a joke.", "What is 2 + 2?",
             "Name three colours.", "Who wrote Hamlet?"]
requests_pool = []
for s in systems:
    for q in questions:
        requests_pool.append({"messages": [{"role": "system", "content": s}, {"role": "user", "content": q}],
                              "max_tokens": 8, "temperature": 0})
for q in questions:  # distinct prefixes: no system message
    requests_pool.append({"messages": [{"role": "user", "content": q}], "max_tokens": 8, "temperature": 0})

server = Server(binary, model, session_dir=os.path.join(work, "load"), slots=n_slots)
alone = []
for body in requests_pool:
    r = server.post("/v1/chat/completions", body)
    r.raise_for_status()
    alone.append(r.json()["choices"][0]["message"]["content"])

rng = random.Random(20261206)
plan = [rng.randrange(len(requests_pool)) for _ in range(n_requests)]
lock = threading.Lock()
latencies, errors, mismatches = [], [], []
cursor = [0]


def client():
    while True:
        with lock:
            if cursor[0] >= len(plan):
                return
            i = plan[cursor[0]]
            cursor[0] += 1
        t0 = time.perf_counter()
        try:
            r = server.post("/v1/chat/completions", requests_pool[i])
        except Exception as e:  # noqa: BLE001 - any failure is an error of the run
            errors.append(str(e))
            continue
        dt = time.perf_counter() - t0
        with lock:
            latencies.append(dt)
            if r.status_code != 200:
                errors.append("%d %s" % (r.status_code, r.text[:200]))
            elif r.json()["choices"][0]["message"]["content"] != alone[i]:
                mismatches.append(i)


t0 = time.perf_counter()
threads = [threading.Thread(target=client) for _ in range(n_clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0

metrics = {}
for line in server.get("/metrics").text.splitlines():
    if line and not line.startswith("#"):
        name, value = line.rsplit(" ", 1)
        metrics[name] = float(value)
over = [n for n in metrics if n.startswith("tierkv_tier_used_bytes_peak")
        if metrics[n] > metrics[n.replace("used_bytes_peak", "budget_bytes")]]
server.term()

latencies.sort()
p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
print("load: %d requests, %d clients, %d slots: %.1f requests/s, latency p50 %.0f ms, p99 %.0f ms; "
      "%d prompt tokens computed, %d reused"
      % (len(latencies), n_clients, n_slots, len(latencies) / wall, 1e3 * p(0.50), 1e3 * p(0.99),
         metrics.get("tierkv_prompt_tokens_total", 0), metrics.get("tierkv_prompt_tokens_cached_total", 0)))
failed = False
if errors:
    print("errors:", errors[:5], "(%d)" % len(errors))
    failed = True
if mismatches:
    print("answers that differ from the request run alone:", sorted(set(mismatches)))
    failed = True
if over:
    print("tiers past their budgets:", over)
    failed = True
if len(latencies) != n_requests:
    print("answered %d of %d" % (len(latencies), n_requests))
    failed = True
sys.exit(1 if failed else 0)
