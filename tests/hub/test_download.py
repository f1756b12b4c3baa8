#!/usr/bin/python3
"""Expert download end to end: a real hub and real workers without --model,
as separate processes on loopback. Workers fetch /v1/model and their experts
over HTTP into their cache directories; the hub's greedy tokens must equal
--local's. The HTTP endpoints are also checked with Python's own client
(bytes, X-MoEx-Hash against libxxhash's XXH3, ranges, 400/403/404/416).

usage: test_download.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
"""
import ctypes
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distlib  # noqa: E402
from distlib import PROMPT, check, finish_script, free_port, scenario  # noqa: E402

distlib.setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
BIN, VOCAB, WORK = distlib.BIN, distlib.VOCAB, distlib.WORK
TOKEN = "dl-token"
N = 16

_xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(data):
    return _xxh.XXH3_64bits(data, len(data))


def gen_model():
    # every matrix of a different type (q4_1, q5_0, q5_1, q5_K, q6_K, q8_0): per-layer types and sizes differ
    path = os.path.join(WORK, "qwen3moe-mixed-21.gguf")
    if not os.path.exists(path):
        subprocess.run([f"{BIN}/moex-gguf", "gen", "--arch", "qwen3moe", "--preset", "test", "--vocab",
                        os.path.join(VOCAB, "ggml-vocab-llama-spm.gguf"), "--type", "mixed", "--seed", "21",
                        "-o", path, "--quiet"], check=True)
    return path


def local_tokens(model):
    return distlib.local_tokens(model, N)


class Hub:
    """A one-shot hub (r=1, waits for 2 workers) with its stderr collected."""

    def __init__(self, model):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [f"{BIN}/moex-hub", "-m", model, "--port", str(self.port), "--token", TOKEN, "--prompt-tokens", PROMPT,
               "-n", str(N), "--temp", "0", "--print-tokens", "--ignore-eos", "--threads", "1", "--replicas", "1",
               "--min-workers", "2", "--wait-s", "60"]
        env = dict(os.environ, MOEX_LOG="info")
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=self._drain, args=(self.p.stdout, self.out), daemon=True),
                        threading.Thread(target=self._drain, args=(self.p.stderr, self.err), daemon=True)]
        for r in self.readers:
            r.start()
        self.workers = []
        deadline = time.time() + 10
        while "hub listening" not in "".join(self.err) and time.time() < deadline:
            time.sleep(0.02)

    @staticmethod
    def _drain(pipe, sink):
        for line in iter(pipe.readline, ""):
            sink.append(line)

    def log(self):
        return "".join(self.err)

    def start_worker(self, name, cache, extra=()):
        cmd = [f"{BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{self.port}/ws", "--token", TOKEN, "--threads", "1",
               "--name", name, "--cache-dir", cache, *extra]
        logpath = os.path.join(WORK, f"worker-{self.port}-{name}.log")
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(logpath, "w"),
                             env=dict(os.environ, MOEX_LOG="info"))
        p.logpath = logpath
        self.workers.append(p)
        return p

    def wait_log(self, pattern, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline and self.p.poll() is None:
            if re.search(pattern, self.log()):
                return True
            time.sleep(0.02)
        return bool(re.search(pattern, self.log()))

    def finish(self, timeout=90):
        distlib.wait_hub(self.p, self.readers, self.err, self.workers, timeout)
        return self.p.returncode, "".join(self.out).split(), self.log()


def get(url, headers=None):
    """(status, headers (case-insensitive), body) of a GET; HTTP errors are answers too."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def worker_log(p):
    with open(p.logpath) as f:
        return f.read()


def cache_files(cache):
    """{name: bytes} of the files of the one model directory under cache."""
    dirs = [os.path.join(cache, d) for d in os.listdir(cache)] if os.path.isdir(cache) else []
    files = {}
    for d in dirs:
        for name in os.listdir(d):
            if name != "lock":
                with open(os.path.join(d, name), "rb") as f:
                    files[name] = f.read()
    return dirs, files


MODEL = gen_model()
REF = local_tokens(MODEL)
CACHE = [os.path.join(WORK, "cache-w0"), os.path.join(WORK, "cache-w1")]
EXPERTS = {}   # "L-E.bin" -> bytes served by the hub
HASHES = {}    # "L-E.bin" -> its X-MoEx-Hash


def fetch_reference(h):
    """The hub's model description and every expert, through Python's HTTP client."""
    st, hdr, body = get(f"{h.base}/v1/model?token={TOKEN}")
    import json
    info = json.loads(body) if st == 200 else {}
    check("GET /v1/model: 200 JSON", st == 200 and info.get("n_layers") == 2 and info.get("n_experts") == 8,
          f"status {st}")
    types = {info["layers"][l][m]["type"] for l in range(2) for m in ("gate", "up", "down")} if info else set()
    check("  matrix types per layer", len(types) == 6, f"{sorted(types)}")
    hashes_ok = sizes_ok = True
    for l in range(info.get("n_layers", 0)):
        for e in range(info.get("n_experts", 0)):
            st, hdr, body = get(f"{h.base}/v1/expert/{l}/{e}", {"Authorization": f"Bearer {TOKEN}"})
            want = int(hdr.get("X-MoEx-Hash", "0"), 16)
            hashes_ok &= st == 200 and xxh3(body) == want
            sizes_ok &= len(body) == info["layers"][l]["expert_bytes"]
            EXPERTS[f"{l}-{e}.bin"] = body
            HASHES[f"{l}-{e}.bin"] = want
    check("GET /v1/expert/L/E: X-MoEx-Hash is the XXH3 of the bytes", hashes_ok and len(EXPERTS) == 16)
    check("  sizes match /v1/model's expert_bytes", sizes_ok)
    full = EXPERTS.get("1-3.bin", b"")
    st, hdr, body = get(f"{h.base}/v1/expert/1/3?token={TOKEN}", {"Range": "bytes=1000-"})
    check("Range bytes=N-: 206 with the tail", st == 206 and body == full[1000:] and
          hdr.get("Content-Range") == f"bytes 1000-{len(full) - 1}/{len(full)}", f"status {st}")
    st, hdr, body = get(f"{h.base}/v1/expert/1/3?token={TOKEN}", {"Range": "bytes=10-19"})
    check("Range bytes=N-M: 206 with the slice", st == 206 and body == full[10:20], f"status {st}")
    st, hdr, body = get(f"{h.base}/v1/expert/1/3?token={TOKEN}", {"Range": f"bytes={len(full)}-"})
    check("Range past the end: 416", st == 416 and hdr.get("Content-Range") == f"bytes */{len(full)}", f"status {st}")


def hostile_requests(h):
    cases = [("/v1/model?token=wrong", {}, 403), ("/v1/expert/0/0", {}, 403),
             ("/v1/expert/0/0", {"Authorization": "Bearer wrong"}, 403),
             (f"/v1/nope?token={TOKEN}", {}, 404), (f"/v1/expert/2/0?token={TOKEN}", {}, 404),
             (f"/v1/expert/0/8?token={TOKEN}", {}, 404), (f"/v1/expert/a/b?token={TOKEN}", {}, 400),
             (f"/v1/expert/1?token={TOKEN}", {}, 400), (f"/v1/expert/1/2/3?token={TOKEN}", {}, 400),
             (f"/v1/expert/-1/2?token={TOKEN}", {}, 400), (f"/v1/expert/99999999999/2?token={TOKEN}", {}, 400),
             (f"/v1/expert/0/0?token={TOKEN}", {"Range": "bytes=x-"}, 400),
             (f"/v1/expert/0/0?token={TOKEN}", {"Range": "lines=1-2"}, 400),
             (f"/v1/expert/0/0?token={TOKEN}", {"Range": "bytes=5-3"}, 400)]
    answers = [(path, get(h.base + path, hdrs), want) for path, hdrs, want in cases]
    bad = [(p, a[0], w) for p, a, w in answers if a[0] != w]
    check("bad token 403, bad paths 404/400, bad Range 400", not bad, f"{bad}")

    def openai_error(body):
        try:
            e = json.loads(body.decode("utf-8"))["error"]
            return isinstance(e["message"], str) and "type" in e
        except (ValueError, KeyError, TypeError):
            return False
    not_json = [(p, a[2][:80]) for p, a, w in answers if not openai_error(a[2])]
    check("  every error body is OpenAI's error JSON", not not_json, f"{not_json}")
    st, _, _ = get(f"{h.base}/v1/model?token={TOKEN}")
    check("  the hub still answers", st == 200 and h.p.poll() is None)
    # a worker with a wrong token: refused at /v1/model, exits with a clear message
    p = subprocess.run([f"{BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{h.port}/ws", "--token", "wrong",
                        "--cache-dir", os.path.join(WORK, "cache-wrong")], capture_output=True, text=True, timeout=30)
    check("wrong-token worker exits 1 with the reason", p.returncode == 1 and "refused the token (HTTP 403)" in p.stderr,
          f"rc={p.returncode} {p.stderr[-300:]}")
    t0 = time.time()  # the hub's log line may land a moment after the worker has exited
    while h.log().count("403: wrong or missing token") < 4 and time.time() - t0 < 5:
        time.sleep(0.05)
    check("  the hub logged the refusals", h.log().count("403: wrong or missing token") >= 4,
          f"{h.log().count('403: wrong or missing token')} lines")


def check_caches(what):
    """Each expert in exactly one cache (r=1), byte-equal to what the hub serves."""
    seen, equal, disjoint = set(), True, True
    for cache in CACHE:
        dirs, files = cache_files(cache)
        for name, data in files.items():
            disjoint &= name not in seen
            seen.add(name)
            equal &= EXPERTS.get(name) == data and xxh3(data) == HASHES.get(name)
    check(f"{what}: the caches hold exactly the experts, once each", seen == set(EXPERTS) and disjoint,
          f"{sorted(seen)}")
    check(f"{what}: every cached file equals the hub's bytes, its XXH3 the hub's X-MoEx-Hash", equal)


@scenario
def download_matches_local():
    for cache in CACHE:
        shutil.rmtree(cache, ignore_errors=True)
    h = Hub(MODEL)
    fetch_reference(h)
    hostile_requests(h)
    # w1 first, alone: it downloads all 16 experts; w0's join then halves its
    # assignment, and the tiny budget evicts what it no longer holds.
    h.start_worker("w1", CACHE[1], ["--memory-budget", "1K"])
    h.wait_log(r"worker w1: ready")
    h.start_worker("w0", CACHE[0], ["--memory-budget", "1K"])
    rc, toks, err = h.finish()
    check("2 downloading workers, r=1: tokens equal --local", rc == 0 and toks == REF,
          f"rc={rc} got={toks[:6]} want={REF[:6]}" + ("" if rc == 0 else err[-2000:]))
    check("  no expert fell back to the hub", "fallbacks 0 " in err)
    check_caches("after the first run")
    w1 = worker_log(h.workers[0])
    check("  w1 evicted what it no longer holds", re.search(r"evicted 8 experts", w1) is not None)
    check("  workers exit 0 on SIGTERM", [w.returncode for w in h.workers] == [0, 0],
          f"{[w.returncode for w in h.workers]}")


def damage(cache, name, keep, corrupt_at=None):
    """Turns a cached .bin into a .part of its first keep bytes (or corrupts it in place)."""
    (d,), _ = cache_files(cache)
    path = os.path.join(d, name)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if corrupt_at is not None:
        data[corrupt_at] ^= 0xFF
    if keep is None:
        with open(path, "wb") as f:
            f.write(data)
        return len(data)
    os.remove(path)
    with open(path[:-4] + ".part", "wb") as f:
        f.write(data[:keep])
    return len(data)


@scenario
def resume_and_repair():
    _, files = cache_files(CACHE[0])
    names = sorted(files)
    if len(names) < 3:
        check("resume: w0 has a cache from download_matches_local", False, f"{names}")
        return
    a, b, c = names[:3]
    # a: cut to a .part (resumed with a Range request); b: a flipped byte (the
    # hub's hash disagrees: downloaded again); c: a .part with a flipped byte
    # (resumed, fails the hash, downloaded again from scratch)
    size_a = damage(CACHE[0], a, keep=1000)
    size_b = damage(CACHE[0], b, keep=None, corrupt_at=77)
    size_c = damage(CACHE[0], c, keep=2000, corrupt_at=5)
    want_bytes = (size_a - 1000) + size_b + (size_c - 2000) + size_c
    h = Hub(MODEL)
    h.start_worker("w1", CACHE[1], ["--memory-budget", "1K"])
    h.wait_log(r"worker w1: ready")
    w0 = h.start_worker("w0", CACHE[0], ["--memory-budget", "1K"])
    rc, toks, err = h.finish()
    check("restarted workers with damaged caches: tokens equal --local", rc == 0 and toks == REF,
          f"rc={rc} got={toks[:6]} want={REF[:6]}" + ("" if rc == 0 else err[-2000:]))
    la, ea = a[:-4].split("-")
    check("  the .part was completed with a Range request (206)",
          re.search(rf"GET /v1/expert/{la}/{ea} bytes=1000- -> 206 \({size_a - 1000} bytes\)", err) is not None)
    log = worker_log(w0)
    m = re.search(r"downloaded (\d+) experts, (\d+) bytes \(.*?(\d+) resumed\)", log)
    got = (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
    check("  w0 fetched exactly the missing bytes", got == (3, want_bytes, 2), f"got {got}, want (3, {want_bytes}, 2)")
    check("  the corrupt file and the corrupt .part were detected",
          "does not match the hub's" in log and "differs from the hub's" in log)
    check_caches("after the repair")
    check("  workers exit 0 on SIGTERM", [w.returncode for w in h.workers] == [0, 0],
          f"{[w.returncode for w in h.workers]}")


finish_script()
