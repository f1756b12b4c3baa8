#!/usr/bin/python3
"""The slowest tests of a ctest run, against their TIMEOUT: test.sh prints
them after each pass, so CI's output shows how close a busy machine comes to
a timeout (every test should stay under half of its own).

usage: slowest.py BUILD_DIR CTEST_OUTPUT_LOG [N]
"""
import json
import re
import subprocess
import sys


def timeouts(build):
    """{test name: TIMEOUT in seconds} from ctest's JSON description (1500: ctest's default)."""
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], capture_output=True, text=True).stdout
    got = {}
    for t in json.loads(out).get("tests", []):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        got[t["name"]] = float(props.get("TIMEOUT", 1500))
    return got


def main():
    build, log = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    with open(log, errors="replace") as f:
        runs = [(float(m.group(3)), m.group(1), m.group(2)) for m in
                re.finditer(r"Test +#\d+: (\S+) \.+\**\s*(\w[\w ]*?)\s+([\d.]+) sec", f.read())]
    limits = timeouts(build)
    runs.sort(reverse=True)
    print(f"the {min(n, len(runs))} slowest tests (seconds, their TIMEOUT, share):")
    for secs, name, result in runs[:n]:
        limit = limits.get(name, 1500)
        flag = "  OVER HALF ITS TIMEOUT" if secs > limit / 2 else ""
        print(f"  {name:40s} {secs:8.1f} s  of {limit:6.0f} s  {secs / limit:5.0%}  {result}{flag}")


if __name__ == "__main__":
    main()
