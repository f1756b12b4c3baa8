"""What the browser tests share: finding the built page and headless
Chromium, a static server for <build>/web and tests/web, and a small
DevTools-protocol client (load a page, evaluate JavaScript, read the console).

A missing tool (emcc's output, chromium) skips a test (exit 77) unless
MOEX_REQUIRE_WEB=1, where it fails (CI that must run them).
"""
import asyncio
import functools
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def need(cond, what):
    """Exits 77 (skipped) when cond is false, or 1 under MOEX_REQUIRE_WEB=1."""
    if cond:
        return
    if os.environ.get("MOEX_REQUIRE_WEB") == "1":
        print(f"FAIL: {what} (MOEX_REQUIRE_WEB=1)")
        sys.exit(1)
    print(f"SKIP: {what}")
    sys.exit(SKIP)


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def check_tools(web_dir):
    need(os.path.exists(os.path.join(web_dir, "moex_wasm.wasm")),
         f"{web_dir}/moex_wasm.wasm is not built (emcc missing? run web/setup_web.sh, then cmake again)")
    need(find_chromium() is not None, "chromium is not installed (web/setup_web.sh installs it)")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                      ".js": "text/javascript", ".wgsl": "text/plain", ".html": "text/html"}

    def log_message(self, *a):
        pass

    def translate_path(self, path):
        # /tests/... from tests/web, everything else from the built page
        path = path.split("?", 1)[0]
        if path.startswith("/tests/"):
            return os.path.join(HERE, path[len("/tests/"):])
        return os.path.join(self.server.web_dir, path.lstrip("/"))


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def serve_static(web_dir):
    """Serves web_dir at / and tests/web at /tests/ on 127.0.0.1; returns (server, port)."""
    srv = _Server(("127.0.0.1", 0), _Quiet)
    srv.web_dir = web_dir
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


class Browser:
    """Headless Chromium with WebGPU on SwiftShader, driven over the DevTools protocol."""

    def __init__(self, extra_args=(), webgpu=True):
        """webgpu=False: a browser without WebGPU (navigator.gpu gives no adapter)."""
        self.profile = tempfile.mkdtemp(prefix="moex-chromium-")
        gpu_flag = "--enable-unsafe-webgpu" if webgpu else "--disable-features=WebGPU"
        args = [find_chromium(), "--headless=new", "--no-sandbox", gpu_flag, "--disable-gpu-sandbox",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-default-apps", "--disable-renderer-backgrounding", "--disable-background-timer-throttling",
                "--remote-debugging-port=0", f"--user-data-dir={self.profile}", *extra_args, "about:blank"]
        self.log = open(os.path.join(self.profile, "chromium.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start (see %s)" % self.log.name)
            time.sleep(0.1)
        time.sleep(0.2)
        self.port = int(open(port_file).read().split()[0])
        ver = json.load(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/version"))
        self.ws_url = ver["webSocketDebuggerUrl"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


class Session:
    """One DevTools connection (asyncio): open pages, evaluate, collect console lines."""

    def __init__(self, ws):
        self.ws, self.next_id, self.pending, self.console = ws, 0, {}, []
        self.reader = asyncio.ensure_future(self._read())
        self.echo = True

    @classmethod
    async def connect(cls, browser):
        import websockets
        ws = await websockets.connect(browser.ws_url, max_size=None)
        return cls(ws)

    async def _read(self):
        async for raw in self.ws:
            m = json.loads(raw)
            if "id" in m and m["id"] in self.pending:
                self.pending.pop(m["id"]).set_result(m)
            elif m.get("method") == "Target.attachedToTarget":
                # a Web Worker of the page: its console too (Runtime.enable in its session)
                sid = m["params"]["sessionId"]
                asyncio.ensure_future(self._enable_runtime(sid))
            elif m.get("method") == "Runtime.consoleAPICalled":
                p = m["params"]
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
                self.console.append(text)
                if self.echo:
                    print(f"[page] {text}", flush=True)
            elif m.get("method") == "Runtime.exceptionThrown":
                d = m["params"]["exceptionDetails"]
                text = d.get("exception", {}).get("description", d.get("text", ""))
                self.console.append("exception: " + text)
                print(f"[page exception] {text}", flush=True)

    async def _enable_runtime(self, sid):
        try:
            await self.send("Runtime.enable", session=sid, timeout=10)
            await self.send("Runtime.runIfWaitingForDebugger", session=sid, timeout=10)
        except Exception:
            pass

    async def send(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        fut = asyncio.get_event_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps(msg))
        r = await asyncio.wait_for(fut, timeout)
        if "error" in r:
            raise RuntimeError(f"{method}: {r['error']}")
        return r.get("result", {})

    async def open(self, url):
        """Opens url in a new tab; returns (target id, session id)."""
        t = await self.send("Target.createTarget", {"url": "about:blank"})
        s = await self.send("Target.attachToTarget", {"targetId": t["targetId"], "flatten": True})
        sid = s["sessionId"]
        await self.send("Runtime.enable", session=sid)
        await self.send("Page.enable", session=sid)
        await self.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True},
                        session=sid)
        await self.send("Page.navigate", {"url": url}, session=sid)
        return t["targetId"], sid

    async def evaluate(self, sid, expr, timeout=60):
        r = await self.send("Runtime.evaluate", {"expression": expr, "awaitPromise": True, "returnByValue": True},
                            session=sid, timeout=timeout)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"].get("exception", {}).get("description", str(r)))
        return r["result"].get("value")

    async def wait_for(self, sid, expr, timeout):
        """Polls expr until it is truthy; returns its value (None on timeout)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                v = await self.evaluate(sid, expr)
            except RuntimeError:
                v = None
            if v:
                return v
            await asyncio.sleep(0.25)
        return None

    async def close_target(self, target):
        await self.send("Target.closeTarget", {"targetId": target})

    async def close(self):
        self.reader.cancel()
        await self.ws.close()


def run_page_test(web_dir, page, timeout):
    """Loads /tests/<page> against the built page, waits for window.__result
    ({passed, failed}) and returns the exit code (0 when nothing failed)."""
    check_tools(web_dir)
    srv, port = serve_static(web_dir)
    browser = Browser()

    async def go():
        s = await Session.connect(browser)
        try:
            _, sid = await s.open(f"http://127.0.0.1:{port}/tests/{page}")
            res = await s.wait_for(sid, "window.__result", timeout)
            return res
        finally:
            await s.close()

    try:
        res = asyncio.run(go())
    finally:
        browser.close()
        srv.shutdown()
    if not res:
        print(f"FAIL: {page} produced no result within {timeout} s")
        return 1
    print(f"{res['passed']} passed, {res['failed']} failed")
    return 0 if res["failed"] == 0 and res["passed"] > 0 else 1
