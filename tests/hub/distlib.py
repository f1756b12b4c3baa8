"""What the end-to-end scripts in tests/hub share: generated models, the
--local reference, a one-shot hub with its workers as real processes on
loopback, the check/scenario bookkeeping and the hostile WebSocket clients.

Each script calls setup(BIN_DIR, VOCAB_DIR, WORK_DIR, scenarios) first and
ends with finish_script() (exit 1 when a check failed).
"""
import asyncio
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures, finish, free_port  # noqa: E402,F401 (scripts import them from here)

TOKEN = "test-token"
PROMPT = "1,15,27,300,4000,5,6,77,8,900"
BIN = VOCAB = WORK = None
_only = set()


def setup(bin_dir, vocab_dir, work_dir, only=()):
    global BIN, VOCAB, WORK, _only
    BIN, VOCAB, WORK, _only = bin_dir, vocab_dir, work_dir, set(only)


def gen_model(arch, typ, seed, vocab="ggml-vocab-llama-spm.gguf"):
    """A generated test-preset model in WORK (reused when present)."""
    path = os.path.join(WORK, f"{arch}-{typ}-{seed}.gguf")
    if not os.path.exists(path):
        subprocess.run([f"{BIN}/moex-gguf", "gen", "--arch", arch, "--preset", "test", "--vocab",
                        os.path.join(VOCAB, vocab), "--type", typ, "--seed", str(seed), "-o", path, "--quiet"],
                       check=True)
    return path


def local_tokens(model, n, prompt=PROMPT, extra=()):
    """The greedy tokens of `moex-hub --local` (the reference every distributed run must print)."""
    out = subprocess.run([f"{BIN}/moex-hub", "--local", "-m", model, "--prompt-tokens", prompt, "-n", str(n),
                          "--temp", "0", "--print-tokens", "--ignore-eos", "--threads", "1", *extra],
                         check=True, capture_output=True, text=True)
    return out.stdout.split()


def stops_within(proc, seconds):
    """SIGTERM to proc; whether it has exited within seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        pass
    return proc.poll() is not None


def metric(err, key):
    """Reads 'key N' from the hub's metrics line."""
    m = re.search(r"hub metrics:.*?\b" + re.escape(key) + r" (\d+)", err)
    return int(m.group(1)) if m else None


def scenario(fn):
    """Runs fn now unless the command line named other scenarios."""
    if not _only or fn.__name__ in _only:
        t0 = time.time()
        fn()
        print(f"     ({fn.__name__}: {time.time() - t0:.1f} s)", flush=True)
    return fn


def finish_script():
    finish("scenarios")


def wait_hub(hub, readers, err, workers, timeout):
    """Waits for a one-shot hub (killed after timeout, noted in err) and its
    output readers, then stops the workers (SIGTERM, SIGKILL after 10 s)."""
    try:
        hub.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        hub.kill()
        hub.wait()
        err.append("\n[test] hub timed out")
    for r in readers:
        r.join(timeout=10)
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.wait(timeout=10)
        except subprocess.TimeoutExpired:
            w.kill()


class Cluster:
    """A one-shot hub generating n_tokens greedily, plus one worker per entry
    of worker_args (extra flags; worker_env: extra environment per worker).
    The hub's stdout/stderr are collected as they come; worker logs go to WORK."""

    def __init__(self, model, n_workers, n_tokens, hub_args=(), worker_args=None, min_workers=None,
                 worker_env=None, token=TOKEN, prompt=PROMPT, hub_env=None):
        self.port = free_port()
        self.model, self.token = model, token
        hub_cmd = [f"{BIN}/moex-hub", "-m", model, "--port", str(self.port), "--token", token,
                   "--prompt-tokens", prompt, "-n", str(n_tokens), "--temp", "0", "--print-tokens", "--ignore-eos",
                   "--threads", "1", "--min-workers", str(min_workers or n_workers), "--wait-s", "60", *hub_args]
        self.hub = subprocess.Popen(hub_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, **(hub_env or {})})
        self.out, self.err = [], []
        self.token_times = []  # when each token was printed (time.monotonic())
        self.readers = [threading.Thread(target=self._drain, args=(self.hub.stdout, self.out, self.token_times),
                                         daemon=True),
                        threading.Thread(target=self._drain, args=(self.hub.stderr, self.err), daemon=True)]
        for r in self.readers:
            r.start()
        self.workers, self.logs = [], []
        time.sleep(0.3)
        for i in range(n_workers):
            self.start_worker(f"w{i}", worker_args[i] if worker_args else (),
                              worker_env[i] if worker_env else None)

    def start_worker(self, name, extra=(), env=None, port=None, scheme="ws"):
        """A worker; port: connect there instead of the hub's (a relay in front of it); scheme: wss for a TLS hub."""
        cmd = [f"{BIN}/moex-worker", "--hub", f"{scheme}://127.0.0.1:{port or self.port}/ws", "--token", self.token,
               "--model", self.model, "--threads", "1", "--name", name, *extra]
        path = os.path.join(WORK, f"worker-{self.port}-{name}.log")
        self.logs.append(path)
        with open(path, "a") as log:  # a restarted worker appends
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.workers.append(p)
        return p

    @staticmethod
    def _drain(pipe, sink, token_times=None):
        prev = ""
        for chunk in iter(lambda: pipe.read(1), ""):
            sink.append(chunk)
            if token_times is not None and chunk in " \n" and prev.isdigit():
                token_times.append(time.monotonic())
            prev = chunk

    @property
    def pid(self):
        return self.hub.pid

    def generation_log(self):
        """The hub's stderr up to the end of generation (its shutdown logs every worker leaving)."""
        err = "".join(self.err)
        end = err.find("moex-hub: load ")
        return err if end < 0 else err[:end]

    def max_token_gap(self, skip=1):
        """The longest time between two printed tokens, after the first `skip` (prefill)."""
        t = self.token_times[skip:]
        return max((b - a for a, b in zip(t, t[1:])), default=0.0)

    def tokens_so_far(self):
        return len("".join(self.out).split())

    def finish(self, timeout=120):
        """Waits for the hub, stops the workers; returns (hub exit code, tokens, hub stderr)."""
        wait_hub(self.hub, self.readers, self.err, self.workers, timeout)
        return self.hub.returncode, "".join(self.out).split(), "".join(self.err)

    def worker_logs(self):
        texts = []
        for path in self.logs:
            with open(path) as f:
                texts.append(f.read())
        return texts


async def hostile_clients(port, token=TOKEN):
    """A wrong token, then text, garbage, truncated, unknown-type, short and
    oversized (1 MiB declared, 64 MiB sent) frames: each connection must be
    refused, or told why (an ERROR frame) and closed by the hub. Returns
    (wrong token refused, connections the hub closed, connections told why
    before the close, attempts). A timeout is not a close. The 64 MiB sender
    is closed while still sending, so its ERROR is lost in the reset: it
    counts as closed, not as told."""
    import websockets
    import fakepeer
    refused = False
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws?token=wrong"):
            pass
    except websockets.InvalidHandshake:
        refused = True
    closed = told = 0
    header = lambda typ, plen: b"MoEx" + struct.pack("<HHIIHHIHBB", 1, typ, plen, 7, 0, 0, 1, 256, 1, 0)
    frames = ["text frame", b"\x00" * 64, b"MoEx\x01\x00", header(99, 0), header(1, 10) + b"\x00" * 10,
              header(2, 1 << 20)]

    async def one(payload, timeout):
        ws = await fakepeer.connect(port, token)
        try:
            await ws.send(payload)
        except websockets.ConnectionClosed:  # the hub closed while we were still sending: a close
            return True, False
        got, was_closed = await fakepeer.frames_until_close(ws, timeout)
        await ws.close()
        return was_closed, any(f.type == fakepeer.ERROR and f.error()[0] < 0 for f in got)

    for f in frames:
        c, t = await one(f, 5)
        closed, told = closed + c, told + (c and t)
    c, _ = await one(b"MoEx" + bytes(64 << 20), 10)  # 64 MiB, over the hub's message bound
    return refused, closed + c, told, len(frames) + 1


def run_hostile_clients(port, token=TOKEN):
    return asyncio.run(hostile_clients(port, token))


def tcp_frame(typ, payload=b"", seq=0):
    """A control frame as the TCP transport carries it (layer, expert and the tensor fields 0)."""
    return b"MoEx" + struct.pack("<HHIIHHIHBB", 1, typ, len(payload), seq, 0, 0, 0, 0, 0, 0) + payload


AUTH, ERROR_TYPE, UNAUTHORIZED = 9, 8, 9


def tcp_peer(port, send, timeout):
    """Connects to the hub's --tcp-port, sends the bytes, reads until the hub closes or timeout s pass.
    Returns (closed by the hub, the ERROR codes it sent first)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got, closed = b"", False
    try:
        if send:
            s.sendall(send)
        deadline = time.time() + timeout
        while time.time() < deadline:
            s.settimeout(max(0.01, deadline - time.time()))
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            got += chunk
    except socket.timeout:
        pass
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    finally:
        s.close()
    codes, off = [], 0
    while len(got) - off >= 28 and got[off:off + 4] == b"MoEx":
        typ, plen = struct.unpack_from("<HI", got, off + 6)
        if typ == ERROR_TYPE and plen >= 4:
            codes.append(struct.unpack_from("<i", got, off + 28)[0])
        off += 28 + plen
    return closed, codes


def tcp_hostile_peers(port, token=TOKEN):
    """What must not get in, or must be thrown out, on the TCP transport: HTTP, a wrong token, a JOIN before
    AUTH, silence (closed after the hub's 5 s), and after a valid AUTH a frame with a bad magic, one over the
    frame limit, half a frame then a close. Returns [(what, closed by the hub, ERROR codes received)]."""
    auth = tcp_frame(AUTH, token.encode())
    big = b"MoEx" + struct.pack("<HHIIHHIHBB", 1, 2, 1 << 31, 7, 0, 0, 1, 256, 1, 0)
    cases = [("HTTP", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5), ("wrong token", tcp_frame(AUTH, b"wrong"), 5),
             ("JOIN before AUTH", tcp_frame(6, bytes(36)), 5), ("silence", b"", 9),
             ("bad magic", auth + b"MOEX" + bytes(24), 5), ("over the frame limit", auth + big, 5)]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(cases)) as pool:  # at once: the silent one alone takes the hub's 5 s
        results = list(pool.map(lambda c: tcp_peer(port, c[1], c[2]), cases))
    out = [(what, *r) for (what, _, _), r in zip(cases, results)]
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(auth + tcp_frame(4, bytes(24))[:40])  # half a HEARTBEAT, then gone
    s.close()
    return out


class Relay:
    """moex-relay in front of a port: each direction delayed by rtt_ms / 2 (+ jitter)."""

    def __init__(self, target_port, rtt_ms, jitter_ms=0.0, mbps=0.0):
        self.proc = subprocess.Popen([f"{BIN}/moex-relay", "--listen", "0", "--to", f"127.0.0.1:{target_port}",
                                      "--rtt-ms", str(rtt_ms), "--jitter-ms", str(jitter_ms), "--mbps", str(mbps)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().split()[-1])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


class ServingHub:
    """A hub without a prompt: it serves workers (and HTTP) until stopped."""

    def __init__(self, model, token=TOKEN, hub_args=(), hub_env=None):
        self.port, self.token, self.model = free_port(), token, model
        self.proc = subprocess.Popen([f"{BIN}/moex-hub", "-m", model, "--port", str(self.port), "--token", token,
                                      "--threads", "1", *hub_args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "MOEX_LOG": "info", **(hub_env or {})})
        self.err = []
        self.reader = threading.Thread(target=Cluster._drain, args=(self.proc.stderr, self.err), daemon=True)
        self.reader.start()
        self.workers, self.logs = [], []
        t0 = time.time()
        while "serving workers on port" not in "".join(self.err) and time.time() - t0 < 30:
            if self.proc.poll() is not None:
                raise RuntimeError("the hub exited: " + "".join(self.err))
            time.sleep(0.05)

    @property
    def pid(self):
        return self.proc.pid

    def start_worker(self, name, extra=()):
        return Cluster.start_worker(self, name, extra)

    def stop(self, timeout=30):
        """SIGTERM, then waits; returns (exit code, stderr). Workers are stopped too."""
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.err.append("\n[test] hub did not stop")
        self.reader.join(timeout=10)
        for w in self.workers:
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()
        return self.proc.returncode, "".join(self.err)
