#!/usr/bin/env python3
# tests/runtime/server/restart_test.py TIERKV MODEL WORKDIR
#
# A 3-turn conversation; the server is killed with SIGKILL between turns 2 and 3 and
# started again on the same --session-dir: turn 3 computes only its new tokens, and its
# tokens (temperature 0) equal those of a server that never stopped. Then SIGTERM during
# a request: the reply completes and the exit code is 0.
import os
import sys
import threading
import time

from serverlib import Server, chat

binary, model, work = sys.argv[1:4]
users = ["Hello, who are you?", "Tell me about lighthouses.", "And what happened next?"]


def turns(server, history, todo, replies):
    for u in todo:
        history.append(("user", u))
        r = chat(server, history, max_tokens=12)
        replies.append(r)
        history.append(("assistant", r["choices"][0]["message"]["content"]))


straight = []
s = Server(binary, model, session_dir=os.path.join(work, "straight"))
turns(s, [], users, straight)
s.term()

history, restarted = [], []
sessions = os.path.join(work, "killed")
s = Server(binary, model, session_dir=sessions)
turns(s, history, users[:2], restarted)
s.kill()  # SIGKILL between turns 2 and 3
s = Server(binary, model, session_dir=sessions)
turns(s, history, users[2:], restarted)

failures = []
for t in range(3):
    a = straight[t]["choices"][0]["message"]["content"]
    b = restarted[t]["choices"][0]["message"]["content"]
    if a != b:
        failures.append("turn %d differs: %r vs %r" % (t + 1, a, b))
third = restarted[2]
cached = third["usage"]["prompt_tokens_details"]["cached_tokens"]
prompt = third["usage"]["prompt_tokens"]
computed = third["timings"]["prompt_n"]
second_total = restarted[1]["usage"]["prompt_tokens"] + restarted[1]["usage"]["completion_tokens"]
print("turn 3 after SIGKILL: prompt %d tokens, %d reused from the saved session, %d computed (%.1f ms)"
      % (prompt, cached, computed, third["timings"]["prompt_ms"]))
if computed != prompt - cached:
    failures.append("turn 3 computed %d tokens, not prompt - cached = %d" % (computed, prompt - cached))
if cached < second_total - 2:
    failures.append("turn 3 reused %d tokens; turns 1-2 held %d" % (cached, second_total))

# SIGTERM while a request computes: it finishes (or is saved), exit 0.
result = {}


def slow():
    result["r"] = s.post("/completion", {"prompt": "Count with me: one two three", "n_predict": 64, "temperature": 0})


t = threading.Thread(target=slow)
t.start()
time.sleep(0.3)
code = s.term()
t.join()
if code != 0:
    failures.append("SIGTERM: exit code %d" % code)
r = result.get("r")
if r is None or r.status_code != 200:
    failures.append("SIGTERM: the request in flight got %s" % (r.status_code if r is not None else "nothing"))

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("restart test passed")
