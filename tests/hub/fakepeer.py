"""Peers that speak the MoEx wire protocol from Python over a real WebSocket
(the websockets library), for the hostile tests: a worker that answers NaN,
garbage or wrong results, joins with absurd fields, presents someone else's
session key, repeats JOIN, sends bad frames or stops reading. Frames follow
docs/PROTOCOL.md (28-byte header, little-endian payloads).

Everything here is asyncio; run_in_thread() runs a coroutine on its own loop
beside the synchronous test code that drives the hub process.
"""
import asyncio
import json
import os
import socket
import struct
import threading
import time
import urllib.request

import numpy as np
import websockets

HEADER = struct.Struct("<4sHHIIHHIHBB")
HEADER_BYTES = HEADER.size  # 28
DISPATCH, RESULT, CANCEL, HEARTBEAT, WEIGHT_SYNC, JOIN, ASSIGN, ERROR = range(1, 9)
F16, BF16, INT8, F32 = 1, 2, 3, 5
STARTING, LOADING, READY, DRAINING = range(4)
# ERROR codes (proto/proto.h moex_proto_error_code)
E_MODEL_MISMATCH, E_BUSY, E_PREEMPTED, E_COMPUTE, E_ALREADY_JOINED, E_VERSION, E_EVICTED, E_REFUSED = range(1, 9)

# The hub of c9ca9d6 (before session keys) had 28- and 24-byte JOIN and ASSIGN
# fixed parts; MOEX_TEST_OLD_PROTO=1 speaks that, to show a test failing there.
OLD_PROTO = os.environ.get("MOEX_TEST_OLD_PROTO") == "1"


def frame(typ, payload=b"", seq=0, layer=0, expert=0, n_tokens=0, hidden=0, dtype=0, flags=0):
    return HEADER.pack(b"MoEx", 1, typ, len(payload), seq, layer, expert, n_tokens, hidden, dtype, flags) + payload


def join_frame(model_hash, name="fake", capacity_centi=100, session=0, backend=0, memory_budget=1 << 30, proto=(1, 1)):
    nb = name if isinstance(name, bytes) else name.encode()
    fixed = struct.pack("<HHBBHQQI", *proto, backend, len(nb), capacity_centi, memory_budget, model_hash, 0)
    if not OLD_PROTO:
        fixed += struct.pack("<Q", session)
    return frame(JOIN, fixed + nb)


def heartbeat_frame(state=READY, seq=0, echo_us=0):
    return frame(HEARTBEAT, struct.pack("<QQIHBB", int(time.monotonic() * 1e6), echo_us, 0, 0, state, 0), seq=seq)


def error_frame(seq, code, text="fake"):
    t = text.encode()
    return frame(ERROR, struct.pack("<iH", code, len(t)) + t, seq=seq)


class Frame:
    """One received frame: header fields and the payload, decoded where a test needs it."""

    def __init__(self, buf):
        (self.magic, self.version, self.type, self.payload_len, self.seq, self.layer, self.expert, self.n_tokens,
         self.hidden, self.dtype, self.flags) = HEADER.unpack_from(buf)
        self.payload = bytes(buf[HEADER_BYTES:HEADER_BYTES + self.payload_len])

    def assign(self):
        """(model_hash, worker_id, replicas, session, [(layer, expert)...]) of an ASSIGN."""
        if OLD_PROTO:
            mh, wid, nl, ne, rep, _, n = struct.unpack_from("<QIHHHHI", self.payload)
            session, off = 0, 24
        else:
            mh, wid, nl, ne, rep, _, n, session = struct.unpack_from("<QIHHHHIQ", self.payload)
            off = 32
        experts = [struct.unpack_from("<HH", self.payload, off + 4 * i) for i in range(n)]
        return mh, wid, rep, session, experts

    def error(self):
        """(code, text) of an ERROR."""
        code, n = struct.unpack_from("<iH", self.payload)
        return code, self.payload[6:6 + n].decode(errors="replace")

    def rows_f32(self):
        """A DISPATCH's values as float32 [n_tokens, hidden] (f16 and f32 wire dtypes)."""
        n = self.n_tokens * self.hidden
        if self.dtype == F16:
            return np.frombuffer(self.payload, np.float16, n).astype(np.float32).reshape(self.n_tokens, self.hidden)
        if self.dtype == F32:
            return np.frombuffer(self.payload, np.float32, n).reshape(self.n_tokens, self.hidden)
        raise ValueError(f"dtype {self.dtype}")


def split_frames(msg):
    """The frames of one WebSocket message (several may share one)."""
    out, off = [], 0
    while len(msg) - off >= HEADER_BYTES:
        f = Frame(msg[off:])
        out.append(f)
        off += HEADER_BYTES + f.payload_len
    return out


def result_frame(dispatch, rows, dtype=F16):
    """A RESULT answering `dispatch` with rows (float32 [n_tokens, hidden])."""
    rows = np.asarray(rows, np.float32).reshape(dispatch.n_tokens, dispatch.hidden)
    payload = rows.astype(np.float16).tobytes() if dtype == F16 else rows.tobytes()
    return frame(RESULT, payload, seq=dispatch.seq, layer=dispatch.layer, expert=dispatch.expert,
                 n_tokens=dispatch.n_tokens, hidden=dispatch.hidden, dtype=dtype)


def model_hash(port, token):
    """The hub's model identity, as a downloading worker learns it (GET /v1/model)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/model", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(json.load(r)["model_hash"], 16)


def ws_url(port, token):
    return f"ws://127.0.0.1:{port}/ws?token={token}"


async def connect(port, token, **kw):
    return await websockets.connect(ws_url(port, token), max_size=None, ping_interval=None, close_timeout=1, **kw)


async def frames_until_close(ws, timeout):
    """Every frame received until the hub closes the connection. Returns
    (frames, closed): closed is True only when the close really came (a
    timeout is not a close)."""
    got = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    got.extend(split_frames(msg))
    except websockets.ConnectionClosed:
        return got, True
    except (asyncio.TimeoutError, TimeoutError):
        return got, False


class FakeWorker:
    """A worker made of Python: joins, reports READY for each ASSIGN, heartbeats,
    and answers each DISPATCH with answer(dispatch) -> message bytes (or None:
    no answer). Records what the hub sent."""

    def __init__(self, port, token, mhash, name, answer=None, capacity_centi=100, session=0):
        self.port, self.token, self.mhash, self.name = port, token, mhash, name
        self.answer, self.capacity_centi, self.session = answer, capacity_centi, session
        self.assigns, self.errors, self.dispatches = [], [], 0
        self.closed = False
        self.ws = None

    async def join(self):
        self.ws = await connect(self.port, self.token)
        await self.ws.send(join_frame(self.mhash, self.name, self.capacity_centi, self.session))

    async def serve(self, until):
        """Serves until until() is true or the hub closes the connection."""
        last_hb = 0.0
        try:
            while not until():
                now = time.monotonic()
                if now - last_hb > 0.5:
                    gen = self.assigns[-1][0] if self.assigns else 0
                    await self.ws.send(heartbeat_frame(READY if self.assigns else STARTING, gen))
                    last_hb = now
                try:
                    msg = await asyncio.wait_for(self.ws.recv(), 0.1)
                except asyncio.TimeoutError:
                    continue
                for f in split_frames(msg) if isinstance(msg, bytes) else []:
                    await self.on_frame(f)
        except websockets.ConnectionClosed:
            self.closed = True

    async def on_frame(self, f):
        if f.type == ASSIGN:
            mh, wid, rep, session, experts = f.assign()
            self.assigns.append((f.seq, wid, session, sorted(experts)))
            await self.ws.send(heartbeat_frame(READY, f.seq))
        elif f.type == ERROR:
            self.errors.append(f.error())
        elif f.type == DISPATCH:
            self.dispatches += 1
            reply = self.answer(f) if self.answer else None
            if reply:
                await self.ws.send(reply)

    async def close(self):
        if self.ws:
            await self.ws.close()


def run_in_thread(coro_fn, *args):
    """Runs coro_fn(*args) on a new event loop in a thread; returns (thread, box)
    where box["result"] (or box["error"]) holds the outcome once joined."""
    box = {}

    def main():
        try:
            box["result"] = asyncio.run(coro_fn(*args))
        except BaseException as e:  # reported by the caller
            box["error"] = e

    t = threading.Thread(target=main, daemon=True)
    t.start()
    return t, box


def hub_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def hub_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def hub_cpu_s(pid):
    """User + system CPU seconds of the process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_connections(port, n):
    """n plain TCP connections that send nothing."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.connect(("127.0.0.1", port))
        out.append(s)
    return out


def tcp_socket(local_port, remote_port):
    """(bytes in its send queue, inode) of the TCP socket local_port -> remote_port
    (/proc/net/tcp{,6}); the send queue is what a peer that stopped reading left
    unread. None if there is no such socket."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                lp, rp = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
                if lp == local_port and rp == remote_port:
                    return int(fields[4].split(":")[0], 16), int(fields[9])
    return None


def holds_socket(pid, inode):
    """Whether process pid still has a descriptor on the socket with this inode."""
    want = f"socket:[{inode}]"
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                return True
        except OSError:
            pass
    return False
