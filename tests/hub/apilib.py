"""What tests/hub/test_api.py uses: a `moex-hub serve` process, the node
client (tests/hub/api, set up by tests/hub/api/setup.sh), a strict parser of
the Prometheus text format, raw HTTP requests, and headless Chromium over
the DevTools protocol.

Tools that may be missing (node with the openai package, chromium) skip the
test (exit 77) unless MOEX_REQUIRE_API_TOOLS=1, where they fail it.
"""
import asyncio
import http.client
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "web"))
import webtest  # noqa: E402  (the browser tests' Chromium and DevTools client)
from webtest import find_chromium  # noqa: E402,F401  (test_api.py's tool check)

NODE_DIR = os.path.join(HERE, "api")
SKIP = 77


def need(cond, what):
    """Exits 77 (skipped) when cond is false, or 1 under MOEX_REQUIRE_API_TOOLS=1."""
    if cond:
        return
    if os.environ.get("MOEX_REQUIRE_API_TOOLS") == "1":
        print(f"FAIL: {what} (MOEX_REQUIRE_API_TOOLS=1)")
        sys.exit(1)
    print(f"SKIP: {what}")
    sys.exit(SKIP)


def have_node_client():
    return shutil.which("node") is not None and os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai"))


# ---- the server ----

class Serve:
    """`moex-hub serve` on a free port; stderr goes to a log file in work."""

    def __init__(self, bin_dir, work, model, port, args=(), key=None, wait_health=True, timeout=120):
        self.port, self.key = port, key
        self.base = f"http://127.0.0.1:{port}"
        cmd = [f"{bin_dir}/moex-hub", "serve", "-m", model, "--port", str(port), "--threads", "1", *args]
        if key:
            cmd += ["--api-key", key]
        self.log_path = os.path.join(work, f"serve-{port}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        if wait_health:
            self.wait_health(timeout)

    def wait_health(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moex-hub serve exited with {self.proc.returncode}:\n{self.text()[-3000:]}")
            try:
                status, _, _ = request(self.port, "GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"moex-hub serve not healthy after {timeout} s:\n{self.text()[-3000:]}")

    def text(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def metrics(self):
        status, _, body = request(self.port, "GET", "/metrics", key=self.key)
        if status != 200:
            raise RuntimeError(f"/metrics: {status} {body[:200]!r}")
        return parse_prometheus(body.decode())

    def stop(self, timeout=30):
        """SIGTERM; returns the exit code (SIGKILL after timeout: -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def request(port, method, path, body=None, key=None, headers=None, timeout=60):
    """One HTTP request on a fresh connection: (status, headers dict, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = dict(headers or {})
    if key:
        h["Authorization"] = f"Bearer {key}"
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=body, headers=h, encode_chunked=h.get("Transfer-Encoding") == "chunked")
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def error_of(body):
    """OpenAI's error JSON: {"error": {"message", "type", "param", "code"}} -> the inner dict, or None."""
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    ok = isinstance(e, dict) and set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str) \
        and isinstance(e["type"], str)
    return e if ok else None


# ---- the node client ----

def run_node_client(work, cfg, name):
    """Runs tests/hub/api/client_test.mjs with cfg; returns (exit code, its lines)."""
    path = os.path.join(work, f"client-{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run(["node", os.path.join(NODE_DIR, "client_test.mjs"), path], capture_output=True, text=True,
                       timeout=900)
    lines = p.stdout.splitlines()
    if p.returncode and not any(l.startswith("FAIL") for l in lines):
        lines.append(f"FAIL node exited with {p.returncode}: {p.stderr[-2000:]}")
    return p.returncode, lines


# ---- Prometheus text format 0.0.4, strictly ----

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
_LABEL_NC = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(r"^(?P<name>" + _NAME + r")(?:\{(?P<labels>" + _LABEL_NC + r"(?:," + _LABEL_NC + r")*)?\})?"
                     r" (?P<value>\S+)(?: (?P<ts>-?\d+))?$")
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def _value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        raise ValueError(f"bad value {s!r}")
    return float(s)


def parse_prometheus(text):
    """{family: {"type", "help", "samples": [(name, labels dict, value)]}}; raises ValueError on anything
    the format does not allow: a sample before its TYPE or of another family, a TYPE twice, a family split
    in two, duplicate series, bad names, labels or values, counters that are negative, histograms whose
    buckets do not rise to +Inf = _count, no final newline."""
    if not text.endswith("\n"):
        raise ValueError("the exposition does not end with a newline")
    fams, current, seen_series, closed = {}, None, set(), set()
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n}: {line[:120]!r}"
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if len(parts) < 4 or not re.fullmatch(_NAME, parts[2]):
                raise ValueError(f"{where}: bad comment")
            name = parts[2]
            if name in closed:
                raise ValueError(f"{where}: family {name} appears twice")
            if current and current != name:
                closed.add(current)
            fam = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            key = "help" if parts[1] == "HELP" else "type"
            if fam[key] is not None:
                raise ValueError(f"{where}: second {parts[1]} for {name}")
            if key == "type":
                if parts[3] not in _TYPES:
                    raise ValueError(f"{where}: unknown type")
                if fam["samples"]:
                    raise ValueError(f"{where}: TYPE after samples")
            fam[key] = parts[3]
            current = name
            continue
        if line.startswith("#") or line == "":
            if line == "":
                raise ValueError(f"{where}: empty line")
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"{where}: not a sample")
        sname, value = m.group("name"), _value(m.group("value"))
        pairs = re.findall(_LABEL, m.group("labels") or "")
        labels = dict(pairs)
        if len(labels) != len(pairs):
            raise ValueError(f"{where}: a label twice")
        base = sname
        for suffix in ("_bucket", "_sum", "_count"):
            if sname.endswith(suffix) and sname[:-len(suffix)] in fams and \
                    fams[sname[:-len(suffix)]]["type"] in ("histogram", "summary"):
                base = sname[:-len(suffix)]
        if base != current or fams[base]["type"] is None:
            raise ValueError(f"{where}: sample outside its family's TYPE block")
        series = (sname, tuple(sorted(labels.items())))
        if series in seen_series:
            raise ValueError(f"{where}: duplicate series")
        seen_series.add(series)
        if fams[base]["type"] == "counter" and not value >= 0:
            raise ValueError(f"{where}: a counter below zero")
        fams[base]["samples"].append((sname, labels, value))
    for name, fam in fams.items():
        if fam["type"] == "histogram":
            _check_histogram(name, fam)
    return fams


def _check_histogram(name, fam):
    groups = {}
    for sname, labels, v in fam["samples"]:
        rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        g = groups.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if sname == name + "_bucket":
            g["buckets"].append((_value(labels["le"]), v))
        elif sname == name + "_sum":
            g["sum"] = v
        elif sname == name + "_count":
            g["count"] = v
        else:
            raise ValueError(f"histogram {name}: stray sample {sname}")
    for g in groups.values():
        b = g["buckets"]
        if not b or b[-1][0] != math.inf or g["count"] is None or g["sum"] is None:
            raise ValueError(f"histogram {name}: needs buckets up to +Inf, _sum and _count")
        if any(b[i][0] >= b[i + 1][0] or b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise ValueError(f"histogram {name}: buckets must rise")
        if b[-1][1] != g["count"]:
            raise ValueError(f"histogram {name}: +Inf bucket {b[-1][1]} != _count {g['count']}")


def sample(fams, family, name=None, **labels):
    """The value of one series (None when absent)."""
    for sname, lab, v in fams.get(family, {}).get("samples", []):
        if sname == (name or family) and all(lab.get(k) == x for k, x in labels.items()):
            return v
    return None


# ---- headless Chromium ----

def chromium_eval_when(url, expression, timeout=30):
    """Loads url in headless Chromium (tests/web/webtest.py's browser and DevTools client) and evaluates
    expression (JavaScript) until it returns something truthy; returns it, or None after timeout seconds."""
    browser = webtest.Browser(webgpu=False)

    async def drive():
        s = await webtest.Session.connect(browser)
        s.echo = False
        try:
            _, sid = await s.open(url)
            return await s.wait_for(sid, expression, timeout)
        finally:
            await s.close()

    try:
        return asyncio.run(drive())
    finally:
        browser.close()
