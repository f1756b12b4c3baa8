"""What the Python benchmarks share: a free loopback port, a server's health,
and held-out Brown text (train/brown-heldout.txt) cut into prompts."""
import http.client
import os
import socket
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def healthy(port):
    """Whether the server on port answers GET /health with 200 now."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        return c.getresponse().status == 200
    except OSError:
        return False


def wait_healthy(port, proc, timeout, what):
    """Waits for /health; exits naming `what` when proc (the server) ends first or timeout seconds pass."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what}: the server exited with {proc.returncode}")
        if healthy(port):
            return
        time.sleep(0.1)
    sys.exit(f"{what}: the server was not healthy after {timeout} s")


def heldout_passages(k, min_words, words):
    """k paragraphs of at least min_words words, spread over the held-out text, each cut to its first words."""
    paras = [p for p in open(os.path.join(REPO, "train", "brown-heldout.txt")).read().split("\n")
             if len(p.split()) >= min_words]
    step = max(1, len(paras) // k)
    return [" ".join(p.split()[:words]) for p in paras[::step][:k]]
