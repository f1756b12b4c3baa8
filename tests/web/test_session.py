#!/usr/bin/python3
"""The browser worker's session rules against a scripted hub: the page in
headless Chromium downloads its experts from a real moex-hub (/v1/*, through
tests/web/proxy.py), while this script plays the hub on /ws, frame by frame:

- JOIN: backend WebGPU (2), the hub's model hash, capabilities in the name,
  capacity 0.01 for a software adapter (0.2 once on the WASM path);
- ASSIGN -> HEARTBEAT READY with seq = the generation; heartbeats every second;
- a RESULT per DISPATCH with its seq, layer, expert, tokens, hidden and dtype
  (f16, bf16, int8, f32);
- the backlog: a DISPATCH for another layer preempts the queued ones (ERROR 3),
  a 65th queued dispatch is refused (ERROR 2), CANCEL drops a queued one;
- an expert not held: ERROR 4; a malformed frame: ERROR with its negative status;
- the cache: a corrupted cached expert is downloaded again, a partial one
  resumed with Range, intact ones not fetched again;
- a lost WebGPU device: the page JOINs again as a CPU worker and still answers;
- ERROR 8 (refused) from the hub: the page reconnects and JOINs again; a silent
  hub: the page reconnects after 5 s; ERROR 7 (evicted): the page stops for good.

usage: test_session.py BIN_DIR VOCAB_DIR WORK_DIR WEB_DIR
"""
import asyncio
import base64
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "hub"))
import distlib  # noqa: E402
import webtest  # noqa: E402
from distlib import check, finish_script  # noqa: E402

BIN, VOCAB, WORK, WEB = sys.argv[1:5]
webtest.check_tools(WEB)
os.makedirs(WORK, exist_ok=True)
distlib.setup(BIN, VOCAB, WORK)
from proxy import Proxy  # noqa: E402

DISPATCH, RESULT, CANCEL, HEARTBEAT, JOIN, ASSIGN, ERROR = 1, 2, 3, 4, 6, 7, 8
F16, BF16, INT8, F32 = 1, 2, 3, 5


def header(typ, plen, seq=0, layer=0, expert=0, ntok=0, hidden=0, dtype=0, flags=0):
    return b"MoEx" + struct.pack("<HHIIHHIHBB", 1, typ, plen, seq, layer, expert, ntok, hidden, dtype, flags)


def parse(frame):
    (ver, typ, plen, seq, layer, expert, ntok, hidden, dtype, flags) = struct.unpack("<HHIIHHIHBB", frame[4:28])
    return {"type": typ, "seq": seq, "layer": layer, "expert": expert, "ntok": ntok, "hidden": hidden,
            "dtype": dtype, "payload": frame[28:28 + plen]}


def dispatch(seq, layer, expert, ntok, hidden, dtype=F16, rng=np.random.default_rng()):
    x = rng.standard_normal((ntok, hidden)).astype(np.float32)
    gates = np.full(ntok, 0.5, dtype=np.float16).tobytes()
    if dtype == F16:
        vals, scales = x.astype(np.float16).tobytes(), b""
    elif dtype == F32:
        vals, scales = x.tobytes(), b""
    elif dtype == BF16:
        vals, scales = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes(), b""
    else:
        s = np.abs(x).max(axis=1) / 127
        vals = np.round(x / s[:, None]).astype(np.int8).tobytes()
        scales = s.astype(np.float32).tobytes()
    body = scales + vals + gates
    return header(DISPATCH, len(body), seq, layer, expert, ntok, hidden, dtype) + body


def assign(gen, model_hash, n_layers, n_experts, experts):
    body = struct.pack("<QIHHHHIQ", model_hash, 1, n_layers, n_experts, 1, 0, len(experts), 0x5e55)
    body += b"".join(struct.pack("<HH", l, e) for l, e in experts)
    return header(ASSIGN, len(body), gen) + body


def error(code, text=b"test"):
    body = struct.pack("<iH", code, len(text)) + text
    return header(ERROR, len(body)) + body


def cancel(seq, layer, expert):
    return header(CANCEL, 0, seq, layer, expert)


# Page JavaScript (main thread, OPFS): corrupts the cached 1-2.bin, and turns
# 1-3.bin into a .part holding its first half.
OPFS_EDIT = """(async () => {
  const d = await (await (await navigator.storage.getDirectory()).getDirectoryHandle('moex')).getDirectoryHandle('%(hash)s');
  const w = await (await d.getFileHandle('1-2.bin')).createWritable({ keepExistingData: true });
  await w.write({ type: 'write', position: 100, data: new Uint8Array(16).fill(0xa5) });
  await w.close();
  await d.removeEntry('1-3.bin');
  const p = await (await d.getFileHandle('1-3.part', { create: true })).createWritable();
  await p.write(Uint8Array.from(atob('%(b64)s'), (ch) => ch.charCodeAt(0)));
  await p.close();
  return true;
})()"""


class Conn:
    """One WebSocket from the page, as the scripted hub sees it."""

    def __init__(self, ws):
        self.ws, self.frames, self.hbs = ws, [], []

    async def next(self, timeout):
        """The next non-heartbeat frame (heartbeats are kept in self.hbs), or None."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                m = await asyncio.wait_for(self.ws.recv(), max(0.01, deadline - time.time()))
            except (asyncio.TimeoutError, Exception):
                return None
            f = parse(m)
            if f["type"] == HEARTBEAT:
                f["hb"] = struct.unpack("<QQIHBB", f["payload"][:24])
                f["t"] = time.time()
                self.hbs.append(f)
                continue
            self.frames.append(f)
            return f
        return None

    async def collect(self, n, timeout):
        out = []
        deadline = time.time() + timeout
        while len(out) < n and time.time() < deadline:
            f = await self.next(deadline - time.time())
            if f is None:
                break
            out.append(f)
        return out

    async def wait_ready(self, gen, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(h["hb"][4] == 2 and h["seq"] == gen for h in self.hbs):
                return True
            await self.next(0.2)
        return False


async def keepalive(ws):
    """The hub's heartbeat every second, as long as the connection lasts."""
    try:
        while True:
            await ws.send(header(HEARTBEAT, 24) + struct.pack("<QQIHBB", int(time.time() * 1e6), 0, 0, 0, 2, 0))
            await asyncio.sleep(1)
    except Exception:
        pass


async def scripted_hub(conns, model, hub_port, proxy_requests, page_eval):
    mh, nl, ne, hidden = int(model["model_hash"], 16), model["n_layers"], model["n_experts"], model["n_embd"]
    c = Conn(await asyncio.wait_for(conns.get(), 60))
    alive = asyncio.ensure_future(keepalive(c.ws))
    j = await c.next(10)
    ok = j is not None and j["type"] == JOIN
    if ok:
        p = j["payload"]
        backend, name_len, cap = p[4], p[5], struct.unpack("<H", p[6:8])[0]
        join_hash = struct.unpack("<Q", p[16:24])[0]
        name = p[28:28 + name_len].decode()
    check("JOIN first, backend WebGPU (2), the hub's model hash, capabilities in the name, a software adapter's capacity",
          ok and backend == 2 and join_hash == mh and "webgpu" in name and "fallback" in name and cap == 1,
          f"{j and j['type']} backend={ok and backend} hash={ok and hex(join_hash)} name={ok and name!r} "
          f"capacity_centi={ok and cap}")
    every = [(l, e) for l in range(nl) for e in range(ne)]
    await c.ws.send(assign(5, mh, nl, ne, every))
    ready = await c.wait_ready(5, 60)
    check("ASSIGN 5 -> HEARTBEAT READY with seq 5", ready,
          f"heartbeats (state, seq): {[(h['hb'][4], h['seq']) for h in c.hbs][-6:]}")
    n0 = len(c.hbs)
    await c.next(3.05)
    check("a heartbeat every second", 2 <= len(c.hbs) - n0 <= 4, f"{len(c.hbs) - n0} in 3 s")

    for dt in (F16, BF16, INT8, F32):
        await c.ws.send(dispatch(7 + dt, 1, 3, 2, hidden, dt))
        r = await c.next(30)
        vals = None
        if r and r["type"] == RESULT:
            body = r["payload"][8:] if dt == INT8 else r["payload"]
            vals = {F16: np.float16, BF16: np.uint16, INT8: np.int8, F32: np.float32}[dt]
            vals = np.frombuffer(body, dtype=vals)
        check(f"RESULT answers a dtype {dt} DISPATCH field for field",
              r is not None and r["type"] == RESULT and (r["seq"], r["layer"], r["expert"], r["ntok"], r["hidden"], r["dtype"])
              == (7 + dt, 1, 3, 2, hidden, dt) and vals is not None and vals.size == 2 * hidden,
              f"{r and {k: v for k, v in r.items() if k != 'payload'}}")

    await c.ws.send(dispatch(10, 0, 0, 1, hidden) + dispatch(11, 0, 1, 1, hidden) + dispatch(12, 0, 2, 1, hidden)
                    + dispatch(13, 1, 0, 1, hidden))
    got = await c.collect(4, 30)
    pre = sorted(f["seq"] for f in got if f["type"] == ERROR and struct.unpack("<i", f["payload"][:4])[0] == 3)
    res = [f["seq"] for f in got if f["type"] == RESULT]
    check("another layer's DISPATCH preempts the queued ones (ERROR 3), and is answered", pre == [10, 11, 12] and res == [13],
          f"errors 3 for {pre}, results {res}")

    await c.ws.send(b"".join(dispatch(100 + i, 0, i % ne, 1, hidden) for i in range(65)))
    got = await c.collect(65, 60)
    busy = [f["seq"] for f in got if f["type"] == ERROR and struct.unpack("<i", f["payload"][:4])[0] == 2]
    res = [f["seq"] for f in got if f["type"] == RESULT]
    check("a full backlog (64) refuses the 65th dispatch with ERROR 2", busy == [164] and sorted(res) == list(range(100, 164)),
          f"busy {busy}, {len(res)} results")

    await c.ws.send(dispatch(200, 0, 0, 1, hidden) + dispatch(201, 0, 1, 1, hidden) + cancel(201, 0, 1))
    got = await c.collect(2, 3)
    check("CANCEL drops a queued dispatch", [f["seq"] for f in got] == [200] and got[0]["type"] == RESULT,
          f"{[(f['type'], f['seq']) for f in got]}")

    await c.ws.send(assign(6, mh, nl, ne, [(0, e) for e in range(ne)]))
    ready = await c.wait_ready(6, 30)
    await c.ws.send(dispatch(300, 1, 3, 1, hidden))
    r = await c.next(10)
    check("a dispatch for an expert no longer held gets ERROR 4", ready and r is not None and r["type"] == ERROR
          and r["seq"] == 300 and struct.unpack("<i", r["payload"][:4])[0] == 4, f"ready={ready} {r and (r['type'], r['seq'])}")

    # The cache: a corrupted cached expert is downloaded again, a partial one resumed.
    path = lambda l, e: f"/v1/expert/{l}/{e}"  # noqa: E731
    with urllib.request.urlopen(f"http://127.0.0.1:{hub_port}{path(1, 3)}?token={distlib.TOKEN}") as r:
        whole = r.read()
    half = len(whole) // 2
    edited = await page_eval(OPFS_EDIT % {"hash": model["model_hash"], "b64": base64.b64encode(whole[:half]).decode()})
    n_req = len(proxy_requests)
    await c.ws.send(assign(7, mh, nl, ne, every))
    ready = await c.wait_ready(7, 60)
    new = proxy_requests[n_req:]
    check("a corrupted cached expert is downloaded again", edited and ready and (path(1, 2), None) in new, f"requests {new}")
    check("a partial download resumes with a Range request", (path(1, 3), f"bytes={half}-") in new)
    check("the intact cached experts are not downloaded again",
          not [p for p in new if p[0].startswith("/v1/expert/1/") and p[0] not in (path(1, 2), path(1, 3))])

    # A lost GPU: the page joins again as a CPU worker and computes from the verified cache.
    await page_eval("window.__moexWorker.postMessage({cmd: 'lose-gpu'}), true")
    try:
        cg = Conn(await asyncio.wait_for(conns.get(), 15))
        alive = asyncio.ensure_future(keepalive(cg.ws))
        j = await cg.next(10)
    except asyncio.TimeoutError:
        cg, j = None, None
    check("a lost WebGPU device: the page joins again as a CPU worker (backend 0)",
          j is not None and j["type"] == JOIN and j["payload"][4] == 0 and struct.unpack("<H", j["payload"][6:8])[0] == 20)
    if cg is None:
        return
    c = cg
    await c.ws.send(assign(8, mh, nl, ne, every))
    ready = await c.wait_ready(8, 60)
    await c.ws.send(dispatch(500, 1, 5, 3, hidden))
    r = await c.next(30)
    check("... and answers dispatches on the CPU", ready and r is not None and r["type"] == RESULT and r["seq"] == 500,
          f"ready={ready} {r and (r['type'], r['seq'])}")

    await c.ws.send(header(99, 0, 400))
    r = await c.next(10)
    code = r and r["type"] == ERROR and struct.unpack("<i", r["payload"][:4])[0]
    check("a malformed frame is answered with its negative status", code == -4, f"code {code}")

    await c.ws.send(error(8, b"refused for the test"))
    alive.cancel()
    try:
        c2 = Conn(await asyncio.wait_for(conns.get(), 15))
        j = await c2.next(10)
    except asyncio.TimeoutError:
        c2, j = None, None
    try:
        await asyncio.wait_for(c.ws.wait_closed(), 3)
        closed = True
    except asyncio.TimeoutError:
        closed = False
    check("ERROR 8 (refused): the page closes the connection, reconnects and JOINs again",
          closed and j is not None and j["type"] == JOIN, f"old connection closed: {closed}")
    key = j is not None and j["type"] == JOIN and struct.unpack("<Q", j["payload"][28:36])[0]
    check("  presenting the session key of the last ASSIGN", key == 0x5e55, f"key {key}")
    if c2 is None:
        return
    t0 = time.time()
    try:
        c3 = Conn(await asyncio.wait_for(conns.get(), 15))
        j = await c3.next(10)
    except asyncio.TimeoutError:
        c3, j = None, None
    check("a hub silent for 5 s: the page reconnects", j is not None and j["type"] == JOIN and 4.5 <= time.time() - t0 <= 9,
          f"after {time.time() - t0:.1f} s")
    if c3 is None:
        return
    await c3.ws.send(error(7, b"evicted for the test"))
    try:
        await asyncio.wait_for(conns.get(), 4)
        again = True
    except asyncio.TimeoutError:
        again = False
    check("ERROR 7 (evicted): the page stops and does not come back", not again)


def main():
    model_path = distlib.gen_model("qwen3moe", "q4_K_M", 31)
    port = distlib.free_port()
    hub = subprocess.Popen([f"{BIN}/moex-hub", "-m", model_path, "--port", str(port), "--token", distlib.TOKEN,
                            "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = browser = None
    try:
        model = None
        for _ in range(100):
            try:
                model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/model?token={distlib.TOKEN}"))
                break
            except Exception:
                time.sleep(0.1)
        check("the hub serves /v1/model", model is not None)
        if model is None:
            return
        conns = asyncio.Queue()

        async def on_ws(ws, path):
            await conns.put(ws)
            await ws.wait_closed()

        proxy = Proxy(WEB, port, ws_handler=on_ws)
        browser = webtest.Browser()
        page = {}

        async def drive():
            s = await webtest.Session.connect(browser)
            s.echo = os.environ.get("MOEX_WEB_ECHO") == "1"
            _, sid = await s.open(f"http://127.0.0.1:{proxy.port}/worker?token={distlib.TOKEN}&name=scripted")
            main = asyncio.get_running_loop()

            async def page_eval(expr):
                return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(s.evaluate(sid, expr), main))

            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                scripted_hub(conns, model, port, proxy.requests, page_eval), proxy.loop))
            await asyncio.sleep(1.2)
            page.update(await s.evaluate(sid, "window.__moex || {}") or {})
            await s.close()

        asyncio.run(drive())
        check("the page says it stopped, and why", "evicted" in (page.get("fatal") or ""), f"fatal={page.get('fatal')!r}")
    finally:
        if browser:
            browser.close()
        if proxy:
            proxy.close()
        hub.terminate()
        hub.wait(10)


main()
finish_script()
