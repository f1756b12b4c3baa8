"""What every Python test script shares (one definition each): check()
prints one outcome and counts a failure, free_port() gives a free loopback
port, finish() prints the tally and exits 1 if anything failed.

A script under tests/DIR/ imports it with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from testlib import check, finish, free_port
"""
import socket
import sys

failures = []


def check(name, cond, detail=""):
    """Prints "ok" or "FAIL" with name; detail (a log's tail, say) when it failed or is short. Returns cond."""
    detail = detail if not cond or len(detail) < 100 else ""
    print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}".rstrip(), flush=True)
    if not cond:
        failures.append(name)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def finish(what="checks"):
    """Prints the tally; exits 1 when a check failed, else 0."""
    print(f"{len(failures)} failed: {', '.join(failures)}" if failures else f"all {what} passed", flush=True)
    sys.exit(1 if failures else 0)
