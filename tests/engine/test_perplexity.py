#!/usr/bin/python3
"""Perplexity of the default (trained) model on held-out Brown Corpus text,
compared across engines (the issue's acceptance numbers):

  --mode peer     moex-hub --local against llama.cpp's perplexity (tests/peer
                  llama_peer) on the same GGUF: PPL within 1 %, the same token
                  count, teacher-forced top-1 ids agreeing at >= 98 % of the
                  scored positions (exit 77 when the peer is missing)
  --mode vulkan   --backend vulkan --local against --local: PPL within 1 %,
                  top-1 >= 98 % (exit 77 without a Vulkan device)
  --mode dist     a hub with two workers against --local: PPL within 1 %,
                  top-1 >= 98 %

Every mode also checks that the model is trained (PPL far below the
vocabulary size, which is what uniform guessing scores) and that the running
estimate ends at the final one.

    test_perplexity.py --bin BUILD/bin --model MODEL.gguf --text FILE --workdir DIR --mode M
                       [--type q8_0|q4_K_M] [--peer LLAMA_PEER] [--ctx 128] [--chunks 12]
"""
import argparse
import os
import re
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures, free_port  # noqa: E402
import time

SKIP = 77
TOL = 0.01          # relative PPL difference allowed between engines
TOP1_MIN = 0.98     # teacher-forced top-1 agreement


def run(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def parse_ppl(out, who):
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    n_tok = re.search(r"perplexity: (\d+) tokens", out)
    running = re.findall(r"\[(\d+)\]([0-9.]+),", out)
    if not final or not n_tok or not running:
        raise RuntimeError(f"{who}: no perplexity in its output:\n{out[-1500:]}")
    ppl = float(final.group(1))
    check(f"{who}: the running estimate ends at the final PPL", abs(float(running[-1][1]) / ppl - 1) < 1e-4,
          f"({running[-1][1]} vs {ppl})")
    return ppl, int(n_tok.group(1)), len(running)


def read_top1(path):
    with open(path) as f:
        return [int(t) for t in f.read().split()]


def agreement(a, b):
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) / max(n, 1), len(a) == len(b)


def ours(a, model, tag, extra=()):
    top1 = os.path.join(a.workdir, f"top1-{tag}.txt")
    out = run([f"{a.bin}/moex-hub", "--local", "-m", model, "--perplexity", a.text_slice, "--ctx", str(a.ctx),
               "--ppl-chunks", str(a.chunks), "--ppl-top1", top1, "--threads", "2", *extra])
    ppl, n_tok, n_chunks = parse_ppl(out, f"moex {tag}")
    return ppl, n_tok, n_chunks, read_top1(top1)


def compare(a, name, base, other):
    (p0, n0, c0, t0), (p1, n1, c1, t1) = base, other
    rel = abs(p1 / p0 - 1)
    check(f"{name}: PPL within {TOL:.0%}", rel < TOL, f"({p1:.4f} vs {p0:.4f}, {rel:.3%})")
    check(f"{name}: same tokens and windows", n0 == n1 and c0 == c1, f"({n1}/{c1} vs {n0}/{c0})")
    agree, same_len = agreement(t0, t1)
    check(f"{name}: top-1 agreement >= {TOP1_MIN:.0%}", same_len and agree >= TOP1_MIN,
          f"({agree:.4f} over {len(t0)} positions)")


def distributed(a, model, n_workers=2):
    port, token = free_port(), "ppl-test"
    top1 = os.path.join(a.workdir, "top1-dist.txt")
    hub = subprocess.Popen([f"{a.bin}/moex-hub", "-m", model, "--port", str(port), "--token", token,
                            "--perplexity", a.text_slice, "--ctx", str(a.ctx), "--ppl-chunks", str(a.chunks),
                            "--ppl-top1", top1, "--threads", "1", "--min-workers", str(n_workers), "--wait-s", "60"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    workers = []
    for i in range(n_workers):
        log = open(os.path.join(a.workdir, f"worker-{i}.log"), "w")
        workers.append(subprocess.Popen([f"{a.bin}/moex-worker", "--hub", f"ws://127.0.0.1:{port}/ws", "--token",
                                         token, "--model", model, "--threads", "1", "--name", f"w{i}"],
                                        stdout=log, stderr=subprocess.STDOUT))
    try:
        out, err = hub.communicate(timeout=600)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()
    if hub.returncode != 0:
        raise RuntimeError(f"distributed hub: exit {hub.returncode}\n{out[-1500:]}{err[-2000:]}")
    ppl, n_tok, n_chunks = parse_ppl(out, "moex hub + workers")
    return ppl, n_tok, n_chunks, read_top1(top1)


def vulkan_available(a):
    p = subprocess.run([f"{a.bin}/moex-hub", "--list-devices"], capture_output=True, text=True)
    return p.returncode == 0


def text_slice(a):
    """The first --bytes of the text, cut after a whole line."""
    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    cut = text.rfind("\n", 0, a.bytes) + 1 or a.bytes
    path = os.path.join(a.workdir, "heldout-slice.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:cut])
    return path


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--mode", choices=("peer", "vulkan", "dist"), required=True)
    ap.add_argument("--type", default="q8_0", help="q8_0: the model as given; else quantized from it")
    ap.add_argument("--peer", default=None)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=12)
    ap.add_argument("--bytes", type=int, default=12000)
    a = ap.parse_args(argv)
    if not os.path.exists(a.model):
        print(f"test_perplexity.py: {a.model} is missing")
        return 1
    if a.mode == "peer" and not (a.peer and os.access(a.peer, os.X_OK)):
        print(f"test_perplexity.py: llama.cpp peer {a.peer} not available; skipped")
        return SKIP
    if a.mode == "vulkan" and not vulkan_available(a):
        print("test_perplexity.py: no Vulkan device; skipped")
        return SKIP
    os.makedirs(a.workdir, exist_ok=True)
    a.text_slice = text_slice(a)
    model = a.model
    if a.type != "q8_0":
        model = os.path.join(a.workdir, f"model-{a.type}.gguf")
        run([f"{a.bin}/moex-gguf", "quantize", a.model, model, "--type", a.type, "--quiet"])
    t0 = time.time()
    base = ours(a, model, "local")
    n_vocab = 32000
    check("the model is trained: PPL far below uniform guessing", base[0] < n_vocab / 10, f"(PPL {base[0]:.2f})")
    print(f"     moex --local {a.type}: PPL {base[0]:.4f} over {base[2]} windows of {a.ctx} ({time.time() - t0:.1f} s)")
    if a.mode == "peer":
        top1 = os.path.join(a.workdir, "top1-llama.txt")
        out = run([a.peer, "perplexity", model, a.text_slice, "--ctx", str(a.ctx), "--chunks", str(a.chunks),
                   "--top1", top1, "--threads", "2"])
        ppl, n_tok, n_chunks = parse_ppl(out, "llama.cpp")
        compare(a, f"llama.cpp vs moex --local ({a.type})", base, (ppl, n_tok, n_chunks, read_top1(top1)))
    elif a.mode == "vulkan":
        compare(a, f"--backend vulkan vs --local ({a.type})", base, ours(a, model, "vulkan", ("--backend", "vulkan")))
    else:
        compare(a, f"hub + 2 workers vs --local ({a.type})", base, distributed(a, model))
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
