"""What the Python benchmarks share: a free loopback port, and held-out Brown
text (train/brown-heldout.txt) cut into prompts."""
import os
import socket

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def heldout_passages(k, min_words, words):
    """k paragraphs of at least min_words words, spread over the held-out text, each cut to its first words."""
    paras = [p for p in open(os.path.join(REPO, "train", "brown-heldout.txt")).read().split("\n")
             if len(p.split()) >= min_words]
    step = max(1, len(paras) // k)
    return [" ".join(p.split()[:words]) for p in paras[::step][:k]]
