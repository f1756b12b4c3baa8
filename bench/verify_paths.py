#!/usr/bin/python3
"""--verify 1 against honest workers of every code path, and against
corrupting ones (docs/PROTOCOL.md, "Verification"; the figures in
docs/PERF.md come from this script).

For each path, a one-shot hub on the shipped model (--replicas 1, --verify 1:
every result checked against the honest bound) whose only worker runs on
that path, decoding until at least --checks results were verified:

  cpu-portable, cpu-avx2, cpu-best    moex-worker with --simd (best: AVX-512 VNNI where the CPU has it)
  vulkan                              moex-worker --backend vulkan (lavapipe where there is no GPU)
  wasm, webgpu                        the worker page in headless Chromium (&cpu=1; WebGPU on SwiftShader)

It prints per path: results verified, the largest share of the bound a
result used, evictions. Then a portable worker that corrupts every result
(--inject-corrupt-prob 1) with noise of each --scales fraction of the row's
RMS: verified before its eviction (1 = caught at once).

usage: verify_paths.py BUILD_DIR [--checks N] [--paths a,b,..] [--scales s,..]
"""
import argparse
import asyncio
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "hub"))
sys.path.insert(0, os.path.join(ROOT, "tests", "web"))
import distlib  # noqa: E402
import webtest  # noqa: E402

MODEL = os.path.join(ROOT, "train", "model", "brown-moe-q8_0.gguf")
TEXT = ("The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced no "
        "evidence that any irregularities took place.")


def prompt_ids(build):
    ids = subprocess.run([f"{build}/bin/moex-gguf", "tokenize", MODEL, TEXT], capture_output=True, text=True,
                         check=True).stdout.split()
    return ",".join(["1"] + ids)


def table(err):
    """{name: (verified, worst share)} from the hub's worker table."""
    return {m.group(1): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^  (\S+) .*? (\d+) \(([\d.]+|inf)\)  \w+$", err, re.M)}


def run(build, path, n_tokens, prompt, worker_extra=()):
    """One hub + one worker on path; returns (rc, verified, evictions, worst, per-worker table, seconds)."""
    hub_args = ["--replicas", "1", "--verify", "1", "--wait-s", "300", "--web-dir", f"{build}/web"]
    c = distlib.Cluster(MODEL, 0, n_tokens, hub_args=hub_args, prompt=prompt, min_workers=1)
    t0 = time.time()
    browser = None
    if path in ("wasm", "webgpu"):
        browser = webtest.Browser(webgpu=path == "webgpu")

        async def drive():
            s = await webtest.Session.connect(browser)
            try:
                _, sid = await s.open(f"http://127.0.0.1:{c.port}/worker?token={distlib.TOKEN}&name={path}"
                                      + ("&cpu=1" if path == "wasm" else ""))
                while c.hub.poll() is None:
                    await asyncio.sleep(0.5)
            finally:
                await s.close()
        task = asyncio.new_event_loop()
        import threading
        th = threading.Thread(target=lambda: task.run_until_complete(drive()), daemon=True)
        th.start()
    else:
        simd = {"cpu-portable": "portable", "cpu-avx2": "avx2"}.get(path)
        extra = ["--backend", "vulkan"] if path == "vulkan" else []
        c.start_worker(path, [*extra, *(["--simd", simd] if simd else []), *worker_extra])
    rc, toks, err = c.finish(timeout=3600)
    if browser:
        browser.close()
    per = table(err)
    worst = max((w for _, w in per.values()), default=float("nan"))
    return rc, distlib.metric(err, "verified"), distlib.metric(err, "evictions"), worst, per, time.time() - t0, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--checks", type=int, default=10000)
    ap.add_argument("--paths", default="cpu-portable,cpu-avx2,cpu-best,vulkan,wasm,webgpu")
    ap.add_argument("--scales", default="1,0.1,0.03,0.01,0.003")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = os.path.join(build, "verify-paths-work")
    os.makedirs(work, exist_ok=True)
    distlib.setup(f"{build}/bin", os.path.join(ROOT, "tests", "data", "vocab"), work)
    prompt = prompt_ids(build)
    # 6 layers x 4 experts a decode token; the model's context is 512
    n_tokens = min(512 - len(prompt.split(",")), a.checks // 24 + 8)
    print(f"shipped model, prompt {len(prompt.split(','))} tokens, {n_tokens} generated, --verify 1", flush=True)
    print(f"{'path':14s} {'verified':>9s} {'worst share':>12s} {'evictions':>10s} {'seconds':>8s}", flush=True)
    for path in a.paths.split(","):
        rc, ver, ev, worst, per, secs, err = run(build, path, n_tokens, prompt)
        note = "" if rc == 0 else f"  (hub exit {rc}: {err[-300:]!r})"
        print(f"{path:14s} {ver if ver is not None else '-':>9} {worst:12.3f} {ev if ev is not None else '-':>10} "
              f"{secs:8.1f}{note}", flush=True)
    print("a worker corrupting every result (cpu-portable): noise of S x the row's RMS on every value", flush=True)
    for s in a.scales.split(","):
        rc, ver, ev, worst, per, secs, err = run(build, "cpu-portable", 16, prompt,
                                                 ["--inject-corrupt-prob", "1", "--inject-corrupt-scale", s,
                                                  "--reconnect-max-s", "1"])
        first = re.search(r"result of layer (\d+) expert (\d+)", err)
        print(f"  S = {s:6s}: evictions {ev}, results verified {ver}"
              + (f", first caught at layer {first.group(1)} expert {first.group(2)}" if first else ""), flush=True)


if __name__ == "__main__":
    main()
