"""Minimal GGUF v3 writer for the reference's own tests (f32/f16 tensors and
scalar/string metadata): lets the reference be checked before, and apart
from, the C generator."""
import struct

import numpy as np

ALIGN = 32


def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key, v):
    if isinstance(v, str):
        return _str(key) + struct.pack("<I", 8) + _str(v)
    if isinstance(v, float):
        return _str(key) + struct.pack("<If", 6, v)
    return _str(key) + struct.pack("<II", 4, v)


def write_gguf(path, kv, tensors):
    """kv: {key: int|float|str}; tensors: {name: (numpy array in numpy shape, 'f32'|'f16')}
    or {name: ("raw", ggml type id, ne list, bytes)} for ready-made blocks."""
    type_ids = {"f32": (0, "<f4"), "f16": (1, "<f2")}
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    head += b"".join(_kv(k, v) for k, v in kv.items())
    blobs, offset = [], 0
    for name, spec in tensors.items():
        if spec[0] == "raw":
            _, tid, ne, blob = spec
        else:
            arr, t = spec
            tid, dt = type_ids[t]
            ne = list(reversed(arr.shape))
            blob = np.ascontiguousarray(arr, dtype=dt).tobytes()
        head += _str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", tid, offset)
        blob += bytes(-len(blob) % ALIGN)
        blobs.append(blob)
        offset += len(blob)
    head += bytes(-len(head) % ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
