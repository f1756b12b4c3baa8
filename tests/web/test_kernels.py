#!/usr/bin/python3
"""The browser worker's kernels in headless Chromium (WebGPU on SwiftShader):
every WGSL expert kernel and the WASM CPU path against float64 references on
fresh random inputs (tests/web/kernels_test.js does the work).
usage: test_kernels.py WEB_DIR"""
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import webtest  # noqa: E402

sys.exit(webtest.run_page_test(sys.argv[1], "kernels.html", timeout=float(os.environ.get("MOEX_WEB_TIMEOUT", "900"))))
