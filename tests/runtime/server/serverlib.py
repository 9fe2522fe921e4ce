# tests/runtime/server/serverlib.py: starts `tierkv serve` on a free loopback port for the
# client tests (python3 + requests), and stops it.
import os
import re
import signal
import subprocess
import threading
import time

import requests


class Server:
    def __init__(self, binary, model, session_dir=None, slots=2, ctx=512, ram="64MiB", frame="64KiB", threads=1,
                 extra=(), warmup=False):
        args = [binary, "serve", "-m", model, "--port", "0", "-c", str(ctx), "-np", str(slots),
                "--ram", ram, "--frame", frame, "--mlock", "off", "-t", str(threads)]
        if not warmup:
            args.append("--no-warmup")
        if session_dir:
            args += ["--session-dir", session_dir]
        args += list(extra)
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"ready: http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(600) or self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        self.url = "http://127.0.0.1:%d" % self.port

    def post(self, path, body, **kw):
        return requests.post(self.url + path, json=body, timeout=300, **kw)

    def get(self, path, **kw):
        return requests.get(self.url + path, timeout=60, **kw)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def term(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def chat(server, history, max_tokens=8):
    r = server.post("/v1/chat/completions",
                    {"messages": [{"role": a, "content": c} for a, c in history],
                     "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()
