#!/usr/bin/python3
"""The hub serving the browser worker page (hub/http_static.c), with Python's
own HTTP client against a real moex-hub and a generated page directory (no
emscripten needed): /worker redirects to /worker/ keeping the query, each
file type has its Content-Type, HEAD gives the head alone, missing files,
hidden files, directories and links out of the directory are 404, no path
leaves the directory, the page needs no token while /ws and /v1 still do,
a large file streams without the hub's memory growing, keep-alive works,
the default directory is found beside the executable (and its absence is
said), and `moex-hub serve` serves the page too (not with --local).

usage: test_static.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
"""
import asyncio
import hashlib
import http.client
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distlib  # noqa: E402
from distlib import check, finish_script, free_port, gen_model, scenario  # noqa: E402

distlib.setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
BIN, WORK = distlib.BIN, distlib.WORK
TOKEN = distlib.TOKEN
MODEL = gen_model("qwen3moe", "q8_0", 7)
SECRET = b"not for the web: 5ecr3t\n"
BIG = 64 << 20


def make_webroot():
    """A page directory with one file of each type, a subdirectory, a hidden file, a link out of it,
    and a large file; a secret file beside it that must never be served."""
    root = os.path.join(WORK, "webroot")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "sub"))
    files = {"index.html": b"<!doctype html><title>page</title>\n", "app.js": b"console.log('app');\n",
             "m.wasm": b"\x00asm\x01\x00\x00\x00", "k.wgsl": b"@compute @workgroup_size(1) fn main() {}\n",
             "s.css": b"body{}\n", "data.bin": bytes(range(256)), "sub/deep.js": b"// deep\n",
             ".hidden": b"hidden\n"}
    for name, data in files.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    with open(os.path.join(WORK, "secret.txt"), "wb") as f:
        f.write(SECRET)
    os.symlink(os.path.join(WORK, "secret.txt"), os.path.join(root, "link.js"))
    block = os.urandom(1 << 20)
    with open(os.path.join(root, "big.bin"), "wb") as f:
        for _ in range(BIG >> 20):
            f.write(block)
    return root, files, hashlib.sha256(block * (BIG >> 20)).hexdigest()


ROOT, FILES, BIG_SHA = make_webroot()


FORBIDDEN = []   # every 403 answer: the hub counts each as refused


def request(port, path, method="GET", headers=None, conn=None):
    """(status, headers dict with lower-case names, body); path is sent as it is."""
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.putrequest(method, path, skip_accept_encoding=True)
    for k, v in (headers or {}).items():
        c.putheader(k, v)
    c.endheaders()
    r = c.getresponse()
    body = r.read()
    h = {k.lower(): v for k, v in r.getheaders()}
    if r.status == 403:
        FORBIDDEN.append(path)
    if conn is None:
        c.close()
    return r.status, h, body


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


async def ws_opens(port, query):
    import websockets
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws{query}", subprotocols=["moex"]):
            return True
    except websockets.InvalidHandshake:
        return False


@scenario
def page_files():
    hub = distlib.ServingHub(MODEL, hub_args=["--web-dir", ROOT])
    try:
        p = hub.port
        st, h, body = request(p, "/worker?token=a%20b%26c&name=x")
        check("/worker redirects to /worker/ with the query", st == 302 and h.get("location") == "/worker/?token=a%20b%26c&name=x",
              f"{st} {h.get('location')}")
        st, h, body = request(p, "/worker/")
        check("/worker/ is index.html, without a token", st == 200 and body == FILES["index.html"] and
              h.get("content-type") == "text/html; charset=utf-8", f"{st} {h.get('content-type')}")
        types = {"app.js": "text/javascript", "m.wasm": "application/wasm", "k.wgsl": "text/plain; charset=utf-8",
                 "s.css": "text/css", "index.html": "text/html; charset=utf-8", "data.bin": "application/octet-stream",
                 "sub/deep.js": "text/javascript"}
        for name, want in types.items():
            st, h, body = request(p, f"/worker/{name}")
            check(f"GET /worker/{name}: 200, {want}, the file's bytes, nosniff",
                  st == 200 and h.get("content-type") == want and body == FILES[name] and
                  h.get("x-content-type-options") == "nosniff", f"{st} {h.get('content-type')} {len(body)} bytes")
        st, h, body = request(p, "/worker/app.js", method="HEAD")
        check("HEAD: the head alone, with the file's length", st == 200 and body == b"" and
              h.get("content-length") == str(len(FILES["app.js"])) and h.get("content-type") == "text/javascript",
              f"{st} {h}")
        for path in ("/worker/missing.js", "/worker/.hidden", "/worker/link.js", "/worker/sub", "/worker/sub/"):
            st, h, body = request(p, path)
            check(f"GET {path}: 404", st == 404 and SECRET not in body and b"hidden" not in body, f"{st}")
        # traversal, sent byte for byte as written (lws folds dot segments; the rest is refused)
        for path in ("/worker/../secret.txt", "/worker/%2e%2e/secret.txt", "/worker/..%2fsecret.txt",
                     "/worker/%2e%2e%2fsecret.txt", "/worker/sub/../../secret.txt", "/worker/link.js/../../secret.txt",
                     "/worker//../secret.txt", "/worker/%2E%2E/%2E%2E/%2E%2E/etc/passwd", "/worker/..\\secret.txt",
                     "/worker/....//secret.txt", "/worker/%00/../secret.txt"):
            st, h, body = request(p, path)
            check(f"traversal {path}: refused", st != 200 and SECRET not in body and b"root:" not in body, f"{st}")
        st, h, body = request(p, "/worker/app.js", method="POST", headers={"Content-Length": "0"})
        check("POST /worker/app.js: not served", st != 200, f"{st}")
        # the page needs no token, the rest still does
        st, _, _ = request(p, "/v1/model")
        st2, _, _ = request(p, f"/v1/model?token={TOKEN}")
        check("/v1/model still needs the token", st == 403 and st2 == 200, f"without {st}, with {st2}")
        no_tok, with_tok = asyncio.run(ws_opens(p, "")), asyncio.run(ws_opens(p, f"?token={TOKEN}"))
        FORBIDDEN.append("/ws")
        check("/ws still needs the token", not no_tok and with_tok, f"without: {no_tok}, with: {with_tok}")
        # one connection, several requests (keep-alive), the weights' and the page's alternating
        c = http.client.HTTPConnection("127.0.0.1", p, timeout=30)
        seq = [request(p, u, conn=c)[0] for u in ("/worker/app.js", f"/v1/model?token={TOKEN}", "/worker/s.css",
                                                  "/worker/missing.js", "/worker/index.html")]
        c.close()
        check("keep-alive: five requests on one connection", seq == [200, 200, 200, 404, 200], f"{seq}")
        # a large file streams: the hub's peak memory does not grow by the file's size
        before = vm_hwm_kib(hub.pid)
        st, h, body = request(p, "/worker/big.bin")
        grown = (vm_hwm_kib(hub.pid) - before) >> 10
        check(f"a {BIG >> 20} MiB file arrives whole", st == 200 and hashlib.sha256(body).hexdigest() == BIG_SHA,
              f"{st} {len(body)} bytes")
        check("and streams: the hub's peak memory grew by less than 16 MiB", grown < 16, f"{grown} MiB")
    finally:
        rc, err = hub.stop()
    refused = distlib.metric(err, "refused")
    check("the hub stopped cleanly; it refused only requests outside the page without the token",
          rc == 0 and refused == len(FORBIDDEN) and not any(f.startswith("/worker/") and ".." not in f and "%2" not in f.lower()
                                                            for f in FORBIDDEN),
          f"rc={rc} refused={refused} 403s={FORBIDDEN}")


def start_hub(args, wait_for, binary=None):
    """A hub process (stderr collected) and whether wait_for appeared in its log."""
    port = free_port()
    p = subprocess.Popen([binary or f"{BIN}/moex-hub", *args, "--port", str(port)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env={**os.environ, "MOEX_LOG": "info"})
    log, t0 = "", time.time()
    os.set_blocking(p.stderr.fileno(), False)
    while wait_for not in log and time.time() - t0 < 30 and p.poll() is None:
        log += (p.stderr.read() or b"").decode(errors="replace")
        time.sleep(0.05)
    return p, port, log


def stop_hub(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    rest = (p.stderr.read() or b"").decode(errors="replace")
    p.stderr.close()
    return rest


@scenario
def default_dir():
    """No --web-dir: <dir of the executable>/../web, as in a build tree (bin/ beside web/)."""
    tree = os.path.join(WORK, "tree")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(os.path.join(tree, "bin"))
    exe = os.path.join(tree, "bin", "moex-hub")
    shutil.copy2(f"{BIN}/moex-hub", exe)
    args = ["-m", MODEL, "--token", TOKEN, "--threads", "1"]
    p, port, log = start_hub(args, "serving workers", exe)
    st, _, _ = request(port, "/worker/")
    log += stop_hub(p)
    ok = "no worker page to serve" in log and st != 200
    check("no page beside the executable: said at start, /worker not served", ok, f"{st}" + ("" if ok else log[-600:]))
    shutil.copytree(ROOT, os.path.join(tree, "web"), symlinks=True)
    p, port, log = start_hub(args, "serving workers", exe)
    st, _, body = request(port, "/worker/app.js")
    log += stop_hub(p)
    ok = st == 200 and body == FILES["app.js"] and f"/worker?token={TOKEN}" in log
    check("the page beside the executable (bin/../web) is served and its URL printed", ok,
          f"{st}" + ("" if ok else log[-600:]))


@scenario
def serve_command():
    """moex-hub serve: the page beside the API and the status page (which links it); not with --local."""
    p, port, log = start_hub(["serve", "-m", MODEL, "--token", TOKEN, "--threads", "1", "--web-dir", ROOT],
                             "serving '")
    st, h, body = request(port, "/worker/")
    st2, _, page = request(port, "/")
    log += stop_hub(p)
    ok = st == 200 and body == FILES["index.html"]
    check("serve: /worker/ is the page", ok, f"{st}" + ("" if ok else log[-600:]))
    check("serve: the status page links /worker", st2 == 200 and b'href="/worker"' in page, f"{st2}")
    p, port, log = start_hub(["serve", "-m", MODEL, "--local", "--threads", "1", "--web-dir", ROOT], "serving '")
    st, _, _ = request(port, "/worker/")
    stop_hub(p)
    check("serve --local: no workers, no worker page", st == 404, f"{st}")


finish_script()
