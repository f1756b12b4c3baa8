#!/usr/bin/python3
"""The hub over TLS (hub/tls.c, --tls, --tls-cert/--tls-key) with real
processes on loopback, checked with Python's ssl module and openssl:

- fresh: --tls makes a self-signed certificate (key 0600 in a 0700
  directory) naming localhost, 127.0.0.1 and the host name, prints its
  SHA-256 fingerprint, serves HTTPS (HTTP/1.1 by ALPN) that verifies against
  it and nothing in the clear; a second start reuses it;
- workers: native workers over wss:// with --ca (one with the model, one
  downloading its experts over https) give --local's tokens; one without
  --ca is refused and says to use --ca; one with --insecure connects and
  warns;
- given: --tls-cert/--tls-key serve that pair; a key of another
  certificate, or a file that is no certificate, stops the hub with a clear
  message;
- renewal: a stored certificate that does not name this machine, or expires
  within a week, is made anew.

usage: test_tls.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
"""
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time

# Nothing here may need a name lookup: a machine (a container without an /etc/hosts) may not resolve even
# localhost. Where this process may make a mount namespace (root, unshare), the test runs in one whose /etc/hosts
# is empty, so that a lookup fails here as it would there.
if os.environ.get("MOEX_TLS_NO_HOSTS") is None:
    empty = os.path.join(sys.argv[3], "empty-hosts")
    os.makedirs(sys.argv[3], exist_ok=True)
    open(empty, "w").close()
    inner = f'mount --bind "{empty}" /etc/hosts && exec "{sys.executable}" "$0" "$@"'
    if os.geteuid() == 0 and shutil.which("unshare") and subprocess.run(
            ["unshare", "-m", "sh", "-c", f'mount --bind "{empty}" /etc/hosts'], capture_output=True).returncode == 0:
        print("(in a mount namespace whose /etc/hosts is empty: no name resolves)", flush=True)
        os.environ["MOEX_TLS_NO_HOSTS"] = "1"
        os.execvp("unshare", ["unshare", "-m", "sh", "-c", inner, os.path.abspath(__file__), *sys.argv[1:]])
    print("(names resolve as the machine has them: no mount namespace here)", flush=True)
    os.environ["MOEX_TLS_NO_HOSTS"] = "0"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distlib  # noqa: E402
from distlib import check, finish_script, gen_model, local_tokens, metric, scenario  # noqa: E402

distlib.setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
BIN, WORK = distlib.BIN, distlib.WORK
TOKEN = distlib.TOKEN
N = 12
MODEL = gen_model("qwen3moe", "q8_0", 7)
TLS = os.path.join(WORK, "tls")
CERT = os.path.join(TLS, "cert.pem")
WEBROOT = os.path.join(WORK, "webroot")
os.makedirs(WEBROOT, exist_ok=True)
with open(os.path.join(WEBROOT, "index.html"), "w") as f:
    f.write("<!doctype html><title>tls</title>\n")


def fingerprint(path):
    with open(path) as f:
        der = ssl.PEM_cert_to_DER_cert(f.read())
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def https_get(port, path, cafile=CERT, host="localhost", headers=""):
    """(status, content type, body, ALPN protocol) over TLS verified against cafile (None: the system's CAs)
    for the name host. It connects to 127.0.0.1 and looks up no name: a machine (a container without an
    /etc/hosts) may not resolve even localhost."""
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=20)
    s = ctx.wrap_socket(raw, server_hostname=host)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{headers}Connection: close\r\n\r\n".encode())
    r = http.client.HTTPResponse(s)
    r.begin()
    body = r.read()
    alpn = s.selected_alpn_protocol()
    s.close()
    return r.status, r.getheader("content-type"), body, alpn


def plain_get(port, path):
    """An HTTP/1.1 GET in the clear: the status, or the exception's name."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", path)
        return c.getresponse().status
    except Exception as e:  # noqa: BLE001  (whatever a TLS port does to cleartext)
        return type(e).__name__


def tls_hub(args=(), web=True):
    return distlib.ServingHub(MODEL, hub_args=[*args, *(["--web-dir", WEBROOT] if web else [])])


def failing_hub(args):
    """A hub expected to stop at start: (exit code, stderr)."""
    r = subprocess.run([f"{BIN}/moex-hub", "-m", MODEL, "--port", "0", "--threads", "1", "--token", TOKEN, *args],
                       capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stderr


def openssl_cert(directory, days, san):
    """A self-signed P-256 pair made by the openssl tool, as a stale or foreign certificate."""
    os.makedirs(directory, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", str(days), "-subj", "/CN=other", "-addext", f"subjectAltName={san}",
                    "-keyout", os.path.join(directory, "key.pem"), "-out", os.path.join(directory, "cert.pem")],
                   check=True, capture_output=True)


@scenario
def fresh():
    shutil.rmtree(TLS, ignore_errors=True)
    hub = tls_hub(["--tls", "--tls-dir", TLS])
    try:
        log = "".join(hub.err)
        fp = fingerprint(CERT) if os.path.exists(CERT) else "?"
        check("--tls: a self-signed certificate made at first start, its SHA-256 fingerprint printed",
              "self-signed, made now" in log and f"fingerprint {fp}" in log, f"fingerprint {fp}")
        modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (TLS, CERT, os.path.join(TLS, "key.pem"))}
        check("the directory 0700, the key 0600, the certificate 0644",
              list(modes.values()) == [0o700, 0o644, 0o600], f"{[oct(m) for m in modes.values()]}")
        san = subprocess.run(["openssl", "x509", "-in", CERT, "-noout", "-ext", "subjectAltName"],
                             capture_output=True, text=True).stdout
        check("it names localhost, 127.0.0.1, ::1 and the host name",
              all(n in san for n in ("DNS:localhost", "IP Address:127.0.0.1", "IP Address:0:0:0:0:0:0:0:1",
                                     f"DNS:{socket.gethostname()}")), san.strip().replace("\n", " "))
        st, ctype, body, alpn = https_get(hub.port, "/worker/")
        check("HTTPS verified against it, HTTP/1.1 by ALPN: the page", st == 200 and ctype.startswith("text/html")
              and b"<title>tls</title>" in body and alpn == "http/1.1", f"{st} {ctype} alpn={alpn}")
        st, ctype, body, _ = https_get(hub.port, f"/v1/model?token={TOKEN}", host="127.0.0.1")
        check("HTTPS to 127.0.0.1: /v1/model with the token", st == 200 and "n_experts" in json.loads(body),
              f"{st} {ctype}")
        st, ctype, body, _ = https_get(hub.port, f"/v1/model?token={TOKEN}", headers=(
            "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"))
        check("an h2c upgrade inside TLS: 505, JSON", st == 505 and "error" in json.loads(body), f"{st} {body[:120]!r}")
        try:
            https_get(hub.port, "/worker/", cafile=None)
            refused = False
        except ssl.SSLCertVerificationError:
            refused = True
        check("a client that trusts only the system's authorities refuses it", refused)
        check("nothing in the clear on the TLS port", plain_get(hub.port, "/worker/") != 200)
    finally:
        rc, err = hub.stop()
    check("the hub stopped cleanly", rc == 0, err[-500:] if rc else "")
    hub = tls_hub(["--tls", "--tls-dir", TLS])
    log = "".join(hub.err)
    hub.stop()
    check("a second start reuses it", "self-signed, reused" in log and f"fingerprint {fingerprint(CERT)}" in log)


@scenario
def workers():
    if not os.path.exists(CERT):
        tls_hub(["--tls", "--tls-dir", TLS]).stop()
    ref = local_tokens(MODEL, N)
    c = distlib.Cluster(MODEL, 0, N, hub_args=["--replicas", "1", "--tls", "--tls-dir", TLS], min_workers=2)
    c.start_worker("ca", ["--ca", CERT], scheme="wss")
    dl_log = os.path.join(WORK, f"worker-{c.port}-dl.log")
    with open(dl_log, "w") as log:   # experts over https into its cache, the session over wss
        c.workers.append(subprocess.Popen(
            [f"{BIN}/moex-worker", "--hub", f"https://127.0.0.1:{c.port}", "--token", TOKEN, "--ca", CERT,
             "--cache-dir", os.path.join(WORK, "cache"), "--threads", "1", "--name", "dl"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MOEX_LOG": "info"}))
    c.logs.append(dl_log)
    rc, toks, err = c.finish()
    check("wss with --ca (one worker with the model, one downloading over https): --local's tokens",
          rc == 0 and toks == ref and metric(err, "fallbacks") == 0,
          f"rc={rc} fallbacks={metric(err, 'fallbacks')} got={toks[:6]} want={ref[:6]}" + ("" if rc == 0 else err[-1500:]))
    logs = c.worker_logs()
    ok = "from the hub at https://127.0.0.1" in logs[1]
    check("the downloading worker fetched its experts over https", ok, "" if ok else logs[1][-600:])
    hub = tls_hub(["--tls", "--tls-dir", TLS], web=False)
    logs = {}
    other = os.path.join(WORK, "other-ca")   # a certificate that is not the hub's, for --ca
    openssl_cert(other, 30, "DNS:localhost,IP:127.0.0.1")
    for name, extra in (("noca", ["--reconnect-max-s", "2"]), ("insecure", ["--insecure"]),
                        ("wrongca", ["--reconnect-max-s", "2", "--ca", os.path.join(other, "cert.pem")])):
        logs[name] = os.path.join(WORK, f"worker-{name}.log")
        with open(logs[name], "w") as log:
            hub.workers.append(subprocess.Popen(
                [f"{BIN}/moex-worker", "--hub", f"wss://127.0.0.1:{hub.port}/ws", "--token", TOKEN, "--model", MODEL,
                 "--threads", "1", *extra], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MOEX_LOG": "info"}))
    for w in (hub.workers[0], hub.workers[2]):   # they give up by themselves
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.time() + 30
    while time.time() < deadline and "connected to the hub" not in open(logs["insecure"]).read():
        time.sleep(0.1)
    noca_rc, wrongca_rc = hub.workers[0].returncode, hub.workers[2].returncode
    hub.stop()
    text = open(logs["wrongca"]).read()
    ok = (wrongca_rc == 1 and "giving up" in text and "connected to the hub" not in text
          and "not the one --ca names" in text)
    check("--ca naming another certificate: refused, exits 1, says the certificate is not --ca's", ok,
          "" if ok else f"rc={wrongca_rc} {text[-600:]}")
    text = open(logs["noca"]).read()
    ok = noca_rc == 1 and "giving up" in text and "trust it with --ca" in text
    check("a worker without --ca is refused, exits 1 and says to use --ca", ok, "" if ok else f"rc={noca_rc} {text[-600:]}")
    text = open(logs["insecure"]).read()
    ok = "connected to the hub" in text and "--insecure: the hub's TLS certificate is not checked" in text
    check("--insecure: connects without verification, and warns", ok, "" if ok else text[-600:])


@scenario
def given():
    if not os.path.exists(CERT):
        tls_hub(["--tls", "--tls-dir", TLS]).stop()
    mine = os.path.join(WORK, "given")
    shutil.rmtree(mine, ignore_errors=True)
    shutil.copytree(TLS, mine)
    hub = tls_hub(["--tls-cert", os.path.join(mine, "cert.pem"), "--tls-key", os.path.join(mine, "key.pem")])
    try:
        st, _, _, _ = https_get(hub.port, "/worker/", cafile=os.path.join(mine, "cert.pem"))
        check("--tls-cert/--tls-key: served, said to be given", st == 200 and "(given)" in "".join(hub.err), f"{st}")
    finally:
        hub.stop()
    other = os.path.join(WORK, "other")
    openssl_cert(other, 30, "DNS:localhost")
    rc, err = failing_hub(["--tls-cert", os.path.join(mine, "cert.pem"), "--tls-key", os.path.join(other, "key.pem")])
    check("a key of another certificate: exit 1, said so", rc == 1 and "does not belong to the certificate" in err,
          f"rc={rc} {err[-300:]}")
    rc, err = failing_hub(["--tls-cert", MODEL, "--tls-key", os.path.join(mine, "key.pem")])
    check("a file that is no certificate: exit 1, said so", rc == 1 and "not a PEM certificate" in err,
          f"rc={rc} {err[-300:]}")
    rc, err = failing_hub(["--tls-cert", os.path.join(WORK, "missing.pem"), "--tls-key", os.path.join(mine, "key.pem")])
    check("a missing certificate: exit 1, said so", rc == 1 and "cannot read the TLS certificate" in err,
          f"rc={rc} {err[-300:]}")


@scenario
def renewal():
    for why, days, san in (("does not name this machine", 30, "DNS:localhost"),
                           ("expires within a week", 3, f"DNS:localhost,DNS:{socket.gethostname()},IP:127.0.0.1")):
        d = os.path.join(WORK, "renew")
        shutil.rmtree(d, ignore_errors=True)
        openssl_cert(d, days, san)
        old = fingerprint(os.path.join(d, "cert.pem"))
        hub = tls_hub(["--tls", "--tls-dir", d], web=False)
        log = "".join(hub.err)
        hub.stop()
        new = fingerprint(os.path.join(d, "cert.pem"))
        ok = why.split(" this")[0] in log and "made now" in log and new != old
        check(f"a stored certificate that {why} is made anew", ok, "" if ok else log[-600:])


finish_script()
