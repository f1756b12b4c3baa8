#!/usr/bin/python3
"""Download and cache speeds of the browser worker (docs/BROWSER.md): a
generated bench-moe model (qwen3moe, 8 layers x 32 experts of 1024 x 768,
q4_K_M) served by a real moex-hub; the page, its only worker, downloads all
256 experts (from the page the hub serves), verifies (XXH3 in WASM), stores them
in OPFS and uploads them to WebGPU; then a second tab loads them from the
cache (read + verify + upload). With "tls" the hub serves HTTPS (--tls; Chromium
trusts its key by --ignore-certificate-errors-spki-list). Not a test.
usage: bench_download.py BIN_DIR VOCAB_DIR WORK_DIR WEB_DIR [tls]"""
import asyncio
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "hub"))
import distlib  # noqa: E402
import webtest  # noqa: E402

BIN, VOCAB, WORK, WEB = sys.argv[1:5]
TLS = sys.argv[5:6] == ["tls"]
webtest.check_tools(WEB)
os.makedirs(WORK, exist_ok=True)
distlib.setup(BIN, VOCAB, WORK)

path = os.path.join(WORK, "bench-moe-q4_K_M.gguf")
if not os.path.exists(path):
    subprocess.run([f"{BIN}/moex-gguf", "gen", "--arch", "qwen3moe", "--preset", "bench-moe", "--vocab",
                    os.path.join(VOCAB, "ggml-vocab-llama-spm.gguf"), "--type", "q4_K_M", "--seed", "1", "-o", path,
                    "--quiet"], check=True)
port = distlib.free_port()
hub_log = os.path.join(WORK, "bench-hub.log")
hub = subprocess.Popen([f"{BIN}/moex-hub", "-m", path, "--port", str(port), "--token", distlib.TOKEN, "--threads", "1",
                        "--replicas", "1", "--web-dir", WEB, *(["--tls", "--tls-dir", os.path.join(WORK, "tls")] if TLS else [])],
                       stdout=subprocess.DEVNULL, stderr=open(hub_log, "w"), env={**os.environ, "MOEX_LOG": "info"})
origin = f"{'https://localhost' if TLS else 'http://127.0.0.1'}:{port}"
for _ in range(300):
    try:   # the certificate exists once the hub has started
        ctx = ssl.create_default_context(cafile=os.path.join(WORK, "tls", "cert.pem")) if TLS else None
        model = json.load(urllib.request.urlopen(f"{origin}/v1/model?token={distlib.TOKEN}", context=ctx))
        break
    except Exception:
        time.sleep(0.1)
spki = re.search(r"public key sha256/(\S+)", open(hub_log).read()) if TLS else None
total = sum(l["expert_bytes"] for l in model["layers"]) * model["n_experts"]
browser = webtest.Browser(extra_args=[f"--ignore-certificate-errors-spki-list={spki.group(1)}"] if spki else [])


async def load(s, query):
    t0 = time.time()
    target, sid = await s.open(f"{origin}/worker?token={distlib.TOKEN}{query}")
    st = await s.wait_for(sid, "window.__moex && window.__moex.state === 2 && window.__moex.held > 0 && window.__moex", 900)
    dt = time.time() - t0
    await s.close_target(target)
    await asyncio.sleep(1.5)   # the hub notices the tab is gone
    return dt, st


async def go():
    s = await webtest.Session.connect(browser)
    s.echo = False
    res = {"experts": model["n_layers"] * model["n_experts"], "MiB": total / 2**20, "origin": origin}
    for label, q in (("download", ""), ("cached", ""), ("cached, cpu path", "&cpu=1")):
        dt, st = await load(s, q)
        ss = st["storeStats"]
        res[label] = {"seconds to READY": round(dt, 2), "MiB/s overall": round(total / 2**20 / dt, 1),
                      "backend": st["backend"], "downloaded": ss["downloaded"],
                      "download MiB/s (network + OPFS write)": round(total / 2**20 / ss["dlSeconds"], 1) if ss["dlSeconds"] else None,
                      "OPFS read MiB/s": round(ss["readBytes"] / 2**20 / ss["readSeconds"], 1) if ss["readSeconds"] else None}
    await s.close()
    return res


try:
    print(json.dumps(asyncio.run(go()), indent=1))
finally:
    browser.close()
    hub.terminate()
    hub.wait(10)
