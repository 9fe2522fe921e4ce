#!/usr/bin/env python3
"""scripts/llama_compare.py: tierkv against llama.cpp on one GGUF, side by side.

Builds llama.cpp's side the way the cross-check does (scripts/llama_xcheck/setup.sh:
node-llama-cpp's prebuilt libllama from the npm registry, the zen4 CPU backend, no AMX;
llama_decode.cc reads the weights through mmap, prompt in batches of 512), then for each
depth runs both tools on the same prompt text with the same threads, one after the
other, and prints a markdown table:

  decode tok/s with f16 KV and with each --kv type, prefill tok/s over the prompt,
  peak RSS (getrusage) of the f16 run; each cell "tierkv / llama.cpp (tierkv's over
  llama.cpp's)": a speed ratio above 1 and an RSS ratio below 1 are tierkv ahead.

llama.cpp's number in a cell is its best of flash attention off and on (quantized V needs
it on). tierkv runs with its defaults (`run -m M -f PROMPT -n N --temp 0 -t T --json`,
`--kv-type` for the other KV types; past the model's trained context, linear RoPE
scaling by the smallest factor that reaches the depth, which costs nothing). The prompt
at depth D is this repository's docs (repeated) cut to about D tokens; depth 0 is one
short sentence. A developer's tool, not part of CI.

  scripts/llama_compare.py MODEL.gguf [--depths 0,4096,16384] [--kv q8_0] [-n 64]
      [-t 2] [--rounds 1] [--xc /tmp/tierkv-xcheck] [--tierkv build/release/runtime/tierkv]
"""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def setup_llama(xc):
    """Runs scripts/llama_xcheck/setup.sh in xc; returns (llama_decode, cpu backend)."""
    shared = os.environ.get("TIERKV_SHARED_DIR", os.path.join(os.path.dirname(REPO), "shared"))
    env = dict(os.environ, XC=xc, SHARED=shared, here=os.path.join(HERE, "llama_xcheck"))
    subprocess.run(["bash", "-c", 'set -e; . "$here/setup.sh" >&2'], env=env, check=True)
    return os.path.join(xc, "llama_decode"), os.path.join(xc, "pkg/package/bins/linux-x64/libggml-cpu-zen4.so")


def run_measured(args):
    """Runs args; returns (exit code, stdout, stderr, peak RSS bytes of the child)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(args, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(errors="replace"), ru.ru_maxrss * 1024


def corpus():
    text = ""
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md")) + glob.glob(os.path.join(REPO, "docs", "history", "*.md"))):
        with open(path, encoding="utf-8") as f:
            text += f.read() + "\n"
    return text


class Tierkv:
    def __init__(self, binary, model, threads, n):
        self.binary, self.model, self.threads, self.n = binary, model, threads, n

    def run(self, prompt_path, kv, extra=()):
        args = [self.binary, "run", "-m", self.model, "-f", prompt_path, "-n", str(self.n), "--temp", "0",
                "-t", str(self.threads), "--json", "--kv-type", kv] + list(extra)
        rc, out, err, rss = run_measured(args)
        m = re.search(r"trained context \((\d+) tokens\)", err)
        if rc != 0 and m and not extra:
            # Past the trained context: linear RoPE scaling reaches it, at the same cost.
            need = int(re.search(r"prompt \((\d+) tokens\)", err).group(1)) + self.n if "prompt (" in err else 0
            factor = max(2, math.ceil(need / int(m.group(1)))) if need else 2
            return self.run(prompt_path, kv, ["--rope-scaling", "linear", "--rope-scale", str(factor)])
        if rc != 0:
            sys.exit("tierkv failed: " + err.strip().splitlines()[-1])
        r = json.loads(out)
        t = r["timings"]
        return {"tokens": len(r["prompt_tokens"]), "prefill": t["prefill_tok_s"], "decode": t["decode_tok_s"], "rss": rss}


class Llama:
    def __init__(self, binary, backend, model, threads, n):
        self.binary, self.backend, self.model, self.threads, self.n = binary, backend, model, threads, n

    def run(self, prompt_text, kv):
        best = None
        for fa in ([0, 1] if kv == "f16" else [1]):
            args = [self.binary, self.backend, self.model, prompt_text, str(self.n), str(self.threads), str(fa), kv]
            rc, out, err, rss = run_measured(args)
            if rc != 0:
                sys.exit("llama_decode failed: " + err.strip()[-300:])
            r = json.loads(out.strip().splitlines()[-1])
            cell = {"tokens": r["prompt_tokens"], "prefill": r["prefill_tok_s"], "decode": r["decode_tok_s"], "rss": rss}
            if best is None:
                best = cell
            else:  # the best of flash attention off and on, per measure
                best = {"tokens": cell["tokens"], "prefill": max(best["prefill"], cell["prefill"]),
                        "decode": max(best["decode"], cell["decode"]), "rss": min(best["rss"], cell["rss"])}
        return best


def cell(ours, theirs, unit=""):
    if ours is None or theirs is None:
        return "-"
    fmt = (lambda v: f"{v / 1e6:.0f} MB") if unit == "MB" else (lambda v: f"{v:.0f}")
    ratio = ours / theirs
    return f"{fmt(ours)} / {fmt(theirs)} ({ratio:.2f}x)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--kv", default="q8_0", help="KV types besides f16, comma-separated ('' for none)")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="runs per cell; the median is reported")
    ap.add_argument("--xc", default="/tmp/tierkv-xcheck")
    ap.add_argument("--tierkv", default=os.path.join(REPO, "build/release/runtime/tierkv"))
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    kvs = ["f16"] + [k for k in a.kv.split(",") if k]
    llama_bin, backend = setup_llama(a.xc)
    ours = Tierkv(a.tierkv, os.path.abspath(a.model), a.t, a.n)
    theirs = Llama(llama_bin, backend, os.path.abspath(a.model), a.t, a.n)

    text = corpus()
    with tempfile.TemporaryDirectory() as tmp:
        # Characters per token of this text, from a sample of the longest prompt's size
        # (the docs' mix of prose and tables changes along the text).
        sample_chars = max(20000, min(len(text), int(max(depths) * 3.5)))
        sample = os.path.join(tmp, "sample.txt")
        with open(sample, "w", encoding="utf-8") as f:
            f.write(text[:sample_chars])
        per_token = sample_chars / ours.run(sample, "f16")["tokens"]
        results = {}
        for d in depths:
            want = int(d * per_token * 0.99)
            body = "Tell me about tiered memory." if d == 0 else (text * (want // len(text) + 1))[:want]
            path = os.path.join(tmp, f"p{d}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(body)
            for kv in kvs:
                runs = [(ours.run(path, kv), theirs.run("@" + path, kv)) for _ in range(a.rounds)]
                med = lambda side, key: sorted(r[side][key] for r in runs)[len(runs) // 2]
                results[(d, kv)] = {side: {k: med(i, k) for k in ("tokens", "prefill", "decode", "rss")}
                                    for i, side in enumerate(("ours", "theirs"))}
                print(f"depth {d} {kv}: {results[(d, kv)]}", file=sys.stderr)

    cols = [f"{results[(d, 'f16')]['ours']['tokens']} tokens" if d else "d0" for d in depths]
    print(f"{os.path.basename(a.model)}, {a.t} threads, {a.n} tokens decoded; each cell tierkv / llama.cpp (tierkv's over llama.cpp's)\n")
    print("| | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for kv in kvs:
        print(f"| decode, {kv} KV, tok/s | " + " | ".join(cell(results[(d, kv)]["ours"]["decode"], results[(d, kv)]["theirs"]["decode"]) for d in depths) + " |")
    for kv in kvs:
        print(f"| prefill, {kv} KV, tok/s | " + " | ".join(cell(results[(d, kv)]["ours"]["prefill"], results[(d, kv)]["theirs"]["prefill"]) if d else "-" for d in depths) + " |")
    print("| peak RSS, f16 KV | " + " | ".join(cell(results[(d, "f16")]["ours"]["rss"], results[(d, "f16")]["theirs"]["rss"], "MB") for d in depths) + " |")


if __name__ == "__main__":
    main()
