#!/usr/bin/python3
"""--vk-tune profile=1: the whole-model Vulkan test still passes, and the GPU
timestamp tables it prints are consistent: the per-op rows add up to the
recording's first-to-last span, the host's submit-to-fence time encloses that
span (checks the tick period), and per-layer ops appear once per layer; a
decode recording uses the fused attention step (no qk_norm_rope op) and the
head with the argmax fused (no argmax op).
usage: check_vkprof.py TEST_VK_FORWARD MODEL"""
import os
import re
import subprocess
import sys

env = dict(os.environ, MOEX_VK_TEST_TUNE="profile=1")   # --vk-tune profile=1
p = subprocess.run(sys.argv[1:], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
out = p.stdout
if p.returncode == 77:
    sys.exit(77)
if p.returncode != 0:
    sys.exit("test failed with profile=1:\n" + out[-3000:])

head = re.compile(r"^vkprof recording: (\d+) timed ops, (\d+) runs, GPU ([\d.]+) us/run .*host submit-to-fence ([\d.]+) us/run")
row = re.compile(r"^vkprof (\S+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%")
tables = []
for line in out.splitlines():
    m = head.match(line)
    if m:
        tables.append({"ops": int(m[1]), "gpu": float(m[3]), "host": float(m[4]), "rows": []})
        continue
    m = row.match(line)
    if m and tables:
        tables[-1]["rows"].append((m[1], m[2], float(m[3]), float(m[4])))
if not tables:
    sys.exit("no vkprof table printed:\n" + out[-3000:])

for i, t in enumerate(tables):
    rows = t["rows"]
    total = sum(r[3] for r in rows)
    if abs(total - t["gpu"]) > 0.01 * t["gpu"] + 1.0:
        sys.exit(f"table {i}: rows add up to {total:.1f} us, span is {t['gpu']:.1f} us")
    if t["host"] < 0.99 * t["gpu"]:
        sys.exit(f"table {i}: host {t['host']:.1f} us is shorter than the GPU span {t['gpu']:.1f} us")
    ops = sum(r[2] for r in rows)
    if abs(ops - t["ops"]) > 0.01:
        sys.exit(f"table {i}: rows count {ops} ops, header {t['ops']}")
    per = {}
    for label, kernel, n, _ in rows:
        per.setdefault(label, {})[kernel] = n
    for label in ("embed", "attn_norm_qkv", "attention", "attn_out", "output_head"):
        if label not in per:
            sys.exit(f"table {i}: no row for {label}: {sorted(per)}")
    # one attention step per layer: attn.comp mode 0 (prompt: after qkrope) or attn_dec.comp (decode: fused)
    layers = sum(n for k, n in per["attention"].items() if k.startswith("attn/") or k.startswith("attn_dec/"))
    fused = sum(n for k, n in per["attention"].items() if k.startswith("attn_dec/")) == layers and "qk_norm_rope" not in per
    if not layers or (not fused and per.get("qk_norm_rope", {}).get("qkrope/t0/m0") != layers):
        sys.exit(f"table {i}: per-layer op counts disagree: {per}")
    # the argmax: its own op once per token, or fused into the head (decode)
    if per.get("argmax", {}).get("argmax/t0/m0", 1.0) != 1.0:
        sys.exit(f"table {i}: argmax ops per token: {per['argmax']}")
    t["decode_fused"] = fused and "argmax" not in per
if not any(t.get("decode_fused") for t in tables):
    sys.exit("no recording with the fused decode attention and head: " + str([sorted(t["rows"]) for t in tables])[:2000])
print(f"check_vkprof: {len(tables)} tables consistent; largest span {max(t['gpu'] for t in tables):.0f} us")
