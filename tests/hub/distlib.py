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

TOKEN = "test-token"
PROMPT = "1,15,27,300,4000,5,6,77,8,900"
BIN = VOCAB = WORK = None
_only = set()
failures = []


def setup(bin_dir, vocab_dir, work_dir, only=()):
    global BIN, VOCAB, WORK, _only
    BIN, VOCAB, WORK, _only = bin_dir, vocab_dir, work_dir, set(only)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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


def check(name, cond, detail=""):
    print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}", flush=True)
    if not cond:
        failures.append(name)


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
    print(f"{len(failures)} failed" if failures else "all scenarios passed")
    sys.exit(1 if failures else 0)


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
                 worker_env=None, token=TOKEN, prompt=PROMPT):
        self.port = free_port()
        self.model, self.token = model, token
        hub_cmd = [f"{BIN}/moex-hub", "-m", model, "--port", str(self.port), "--token", token,
                   "--prompt-tokens", prompt, "-n", str(n_tokens), "--temp", "0", "--print-tokens", "--ignore-eos",
                   "--threads", "1", "--min-workers", str(min_workers or n_workers), "--wait-s", "60", *hub_args]
        self.hub = subprocess.Popen(hub_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=self._drain, args=(self.hub.stdout, self.out), daemon=True),
                        threading.Thread(target=self._drain, args=(self.hub.stderr, self.err), daemon=True)]
        for r in self.readers:
            r.start()
        self.workers, self.logs = [], []
        time.sleep(0.3)
        for i in range(n_workers):
            self.start_worker(f"w{i}", worker_args[i] if worker_args else (),
                              worker_env[i] if worker_env else None)

    def start_worker(self, name, extra=(), env=None, port=None):
        """A worker; port: connect there instead of the hub's (a relay in front of it)."""
        cmd = [f"{BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{port or self.port}/ws", "--token", self.token,
               "--model", self.model, "--threads", "1", "--name", name, *extra]
        path = os.path.join(WORK, f"worker-{self.port}-{name}.log")
        self.logs.append(path)
        with open(path, "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.workers.append(p)
        return p

    @staticmethod
    def _drain(pipe, sink):
        for chunk in iter(lambda: pipe.read(1), ""):
            sink.append(chunk)

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
    refused or closed. Returns (wrong token refused, connections closed, attempts)."""
    import websockets
    refused = False
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws?token=wrong"):
            pass
    except Exception:
        refused = True
    closed = 0
    header = lambda typ, plen: b"MoEx" + struct.pack("<HHIIHHIHBB", 1, typ, plen, 7, 0, 0, 1, 256, 1, 0)
    frames = ["text frame", b"\x00" * 64, b"MoEx\x01\x00", header(99, 0), header(1, 10) + b"\x00" * 10,
              header(2, 1 << 20)]
    for f in frames:
        try:
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws?token={token}") as ws:
                await ws.send(f)
                await asyncio.wait_for(ws.wait_closed(), 5)
                closed += 1
        except Exception:
            closed += 1
    try:  # 64 MiB
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws?token={token}", max_size=None) as ws:
            await ws.send(b"MoEx" + bytes(64 << 20))
            await asyncio.wait_for(ws.wait_closed(), 10)
            closed += 1
    except Exception:
        closed += 1
    return refused, closed, len(frames) + 1


def run_hostile_clients(port, token=TOKEN):
    return asyncio.run(hostile_clients(port, token))


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
