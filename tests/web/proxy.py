"""A test-only stand-in for the hub serving the worker page, for
test_session.py, whose script plays the hub on /ws frame by frame: one port
that serves <build>/web at /worker/ (and /worker), forwards /v1/* (HTTP,
Range included) to a real moex-hub and hands /ws to the script (or relays it
to the hub), all same-origin as when the hub serves the page itself."""
import asyncio
import http
import mimetypes
import os
import threading
import urllib.error
import urllib.request

import websockets
import websockets.server

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css",
         ".wasm": "application/wasm", ".wgsl": "text/plain; charset=utf-8"}


class Proxy:
    def __init__(self, web_dir, hub_port, ws_handler=None):
        """ws_handler(websocket, path): a coroutine that plays the hub on /ws itself
        (runs in the proxy's event loop, self.loop) instead of relaying to hub_port."""
        self.web_dir, self.hub_port, self.ws_handler = web_dir, hub_port, ws_handler
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.conns = set()
        self.requests = []   # (path, Range header or None) of every forwarded /v1 request
        threading.Thread(target=self._run, daemon=True).start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)

        async def main():
            self.server = await websockets.serve(self._ws, "127.0.0.1", 0, subprotocols=["moex"],
                                                 process_request=self._http, max_size=None, compression=None)
            self.port = self.server.sockets[0].getsockname()[1]
            self.ready.set()
            await self.server.wait_closed()

        self.loop.run_until_complete(main())

    def close(self):
        self.loop.call_soon_threadsafe(self.server.close)

    async def _http(self, path, headers):
        r = await self._respond(path, headers)
        return r and (http.HTTPStatus(r[0]), r[1], r[2])

    async def _respond(self, path, headers):
        if path.startswith("/ws"):
            return None  # the WebSocket handshake goes on
        if path.startswith("/v1/"):
            return await asyncio.get_event_loop().run_in_executor(None, self._forward, path, headers)
        p = path.split("?", 1)[0]
        if p in ("/worker", "/worker/"):
            p = "/worker/index.html"
        if not p.startswith("/worker/"):
            return 404, [("Content-Type", "text/plain")], b"not found\n"
        f = os.path.normpath(os.path.join(self.web_dir, p[len("/worker/"):]))
        if not f.startswith(os.path.normpath(self.web_dir)) or not os.path.isfile(f):
            return 404, [("Content-Type", "text/plain")], b"not found\n"
        ext = os.path.splitext(f)[1]
        with open(f, "rb") as fh:
            body = fh.read()
        return 200, [("Content-Type", TYPES.get(ext, mimetypes.guess_type(f)[0] or "application/octet-stream")),
                     ("Cache-Control", "no-store")], body

    def _forward(self, path, headers):
        self.requests.append((path.split("?", 1)[0], headers.get("Range")))
        req = urllib.request.Request(f"http://127.0.0.1:{self.hub_port}{path}")
        if "Range" in headers:
            req.add_header("Range", headers["Range"])
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, hdrs, body = r.status, r.getheaders(), r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, body = e.code, e.headers.items(), e.read()
        keep = {"content-type", "content-range", "accept-ranges", "x-moex-hash"}
        return status, [(k, v) for k, v in hdrs if k.lower() in keep], body

    async def _ws(self, client, path):
        """Relays binary messages between the page and the hub until either side closes."""
        if self.ws_handler:
            return await self.ws_handler(client, path)
        self.conns.add(client)
        try:
            async with websockets.connect(f"ws://127.0.0.1:{self.hub_port}{path}", subprotocols=["moex"],
                                          max_size=None, compression=None) as hub:
                async def up():
                    async for m in client:
                        await hub.send(m)

                async def down():
                    async for m in hub:
                        await client.send(m)

                done, pending = await asyncio.wait([asyncio.ensure_future(up()), asyncio.ensure_future(down())],
                                                   return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
                for t in done:
                    t.exception()  # a side that closed abruptly: nothing to report
        except Exception:
            pass
        finally:
            self.conns.discard(client)


if __name__ == "__main__":
    # By hand, until the hub serves the page: python3 tests/web/proxy.py build/web HUB_PORT
    import sys
    import time
    if len(sys.argv) != 3:
        sys.exit("usage: proxy.py WEB_DIR HUB_PORT")
    p = Proxy(sys.argv[1], int(sys.argv[2]))
    print(f"open http://127.0.0.1:{p.port}/worker?token=TOKEN (the hub's --token)", flush=True)
    while True:
        time.sleep(3600)
