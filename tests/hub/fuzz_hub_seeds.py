#!/usr/bin/python3
"""Seed inputs for hub/fuzz_hub.c: a few plausible sessions written in its
input language (one byte of configuration, then steps; see step() there):
workers connect, join, report READY, layers run while they answer with
results, NaN, errors, bad frames, and leave.

usage: fuzz_hub_seeds.py OUT_DIR
"""
import os
import struct
import sys

CONNECT, DISCONNECT, JOIN, HEARTBEAT, RESULTS, ERRORS, RAW, TEXT, TICK, LAYER, WAIT = 0, 1, 2, 4, 5, 8, 9, 10, 11, 12, 14


def op(kind, fake=0):
    return bytes([kind | fake << 4])


def join(fake, name=0, capacity=100, session_choice=0):
    # flags (name; 16: a 16-bit capacity), backend, capacity, memory u64, session choice, JOIN seq
    if capacity <= 256:
        cap = bytes([name, 0, capacity - 1])
    else:
        cap = bytes([name | 16, 0]) + struct.pack("<H", capacity)
    return op(JOIN, fake) + cap + struct.pack("<Q", 1 << 30) + bytes([session_choice, 0])


def ready(fake):
    # one frame: heartbeat state READY for its generation; timestamp, queue depth, load
    return op(HEARTBEAT, fake) + bytes([0, 2]) + struct.pack("<QBH", 1, 0, 0)


def results(fake, kind=1, frames=1):
    # frames-1, then per frame: which dispatch, how (dtype f16, values kind)
    out = op(RESULTS, fake) + bytes([frames - 1])
    for i in range(frames):
        out += bytes([i, kind << 2]) + (bytes([0]) if i else b"")
    return out


def layer(tokens=2, experts=(0, 1, 2, 3, 1, 2, 0, 3), which=0):
    return op(LAYER) + bytes([tokens - 1]) + bytes(experts[:tokens * 2]) + bytes([which])


def session(cfg, *steps):
    return bytes([cfg]) + b"".join(steps)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    up = connect2 = op(CONNECT, 0) + join(0) + ready(0) + op(CONNECT, 1) + join(1, name=1) + ready(1)
    seeds = {
        "answers": session(0, up, layer(), results(0), results(1), results(0), results(1), layer(1)),
        "nan": session(0x10, up, layer(), results(0, kind=2), results(1, kind=3), results(0, kind=5)),
        "timeouts": session(0x04, up, layer(4), op(WAIT), op(WAIT), results(1), op(WAIT)),
        "leave_mid_layer": session(0x01, up, layer(3), op(DISCONNECT, 0), results(1, frames=2)),
        "errors": session(0x02, up, layer(), op(ERRORS, 0) + bytes([1, 0, 17, 0, 0, 20]), results(1)),
        "impostor": session(0x10, up, op(CONNECT, 2) + join(2, name=2) + ready(2), layer(), results(2, kind=0)),
        "reconnect_key": session(0, up, op(DISCONNECT, 0), op(CONNECT, 0) + join(0, session_choice=1) + ready(0),
                                 layer(), results(0)),
        "silence": session(0, up, op(TICK) + bytes([80]), layer(), op(RAW, 1) + bytes([4]) + b"MoEx"),
        "repeat_join": session(0, connect2, join(0), join(0), join(0), op(TEXT, 1), layer()),
        "greedy": session(0, up, op(CONNECT, 2) + join(2, name=3, capacity=65535) + ready(2), layer(), results(2)),
    }
    for name, data in seeds.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
