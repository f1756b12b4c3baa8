#!/usr/bin/env python3
"""docs/PROTOCOL.md's table of ERROR codes must equal the one definition in
proto/ (proto_errors.c), which `test_proto --error-table` prints as rows."""
import re
import subprocess
import sys

test_proto, doc = sys.argv[1], sys.argv[2]
want = subprocess.run([test_proto, "--error-table"], check=True, capture_output=True, text=True).stdout.split("\n")
want = [r.strip() for r in want if r.strip()]
text = open(doc, encoding="utf-8").read()
m = re.search(r"<!-- error-codes -->\n(.*?)<!-- /error-codes -->", text, re.S)
if not m:
    sys.exit(f"{doc}: no <!-- error-codes --> table")
rows = [r.strip() for r in m.group(1).split("\n") if r.strip().startswith("|")]
rows = [re.sub(r"\s*\|\s*", " | ", r).strip() for r in rows[2:]]  # past the header and the rule
got = [re.sub(r"\s*\|\s*", " | ", r).strip() for r in rows]
want = [re.sub(r"\s*\|\s*", " | ", r).strip() for r in want]
if got != want:
    print("docs/PROTOCOL.md's error table differs from proto/proto_errors.c:")
    for g, w in zip(got + [""] * len(want), want + [""] * len(got)):
        if g != w:
            print(f"  doc:   {g}\n  proto: {w}")
    sys.exit(1)
print(f"error table: {len(got)} rows agree")
