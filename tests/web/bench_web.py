#!/usr/bin/python3
"""Prints the browser worker's speeds in headless Chromium (tests/web/bench.js):
one Qwen3-30B-A3B expert x one token on WASM SIMD and WebGPU, 8 experts in one
WebGPU batch, OPFS write/read and XXH3 in WASM. Not a test (docs/BROWSER.md).
usage: bench_web.py WEB_DIR"""
import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import webtest  # noqa: E402

web = sys.argv[1]
webtest.check_tools(web)
srv, port = webtest.serve_static(web)
b = webtest.Browser()


async def go():
    s = await webtest.Session.connect(b)
    s.echo = False
    _, sid = await s.open(f"http://127.0.0.1:{port}/tests/bench.html")
    r = await s.wait_for(sid, "window.__result", 600)
    await s.close()
    return r


try:
    r = asyncio.run(go())
finally:
    b.close()
    srv.shutdown()
print(json.dumps(r and r.get("bench"), indent=1))
