#!/usr/bin/python3
"""Checks an export against the PyTorch model it came from: the logits of
`moex-hub --local` on the exported f32 GGUF must match train/model.py's on the
same tokens (relative L2 per row below --tol).

    check_export.py RUN_DIR MODEL.gguf --hub build/bin/moex-hub [--tokens 1,450,...]
Exit 0 when they match, 1 when not, 77 when PyTorch is missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("gguf")
    ap.add_argument("--hub", required=True)
    ap.add_argument("--tokens", default="1,450,432,29891,4433,8541,6568,29889,1094,278,937,931,29892,372,338")
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("check_export.py: PyTorch is not installed; skipped")
        return 77
    from export_gguf import load_run
    from model import Config, Model
    run, state = load_run(a.run_dir)
    m = Model(Config(**run["model"]))
    m.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    ids = [int(t) for t in a.tokens.split(",")]
    with torch.no_grad():
        ref = m(torch.tensor([ids]))[0][0].double().numpy()
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "logits.f32")
        subprocess.run([a.hub, "--local", "-m", a.gguf, "--prompt-tokens", a.tokens, "-n", "1", "--temp", "0",
                        "--wire-dtype", "exact", "--dump-logits", dump, "--print-tokens"], check=True,
                       capture_output=True)
        ours = np.fromfile(dump, dtype="<f4").reshape(-1, ref.shape[1])[:len(ids)].astype(np.float64)
    rel = np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)
    same = (ours.argmax(1) == ref.argmax(1)).mean()
    print(f"check_export.py: {len(ids)} positions, relative L2 max {rel.max():.2e} mean {rel.mean():.2e}, "
          f"argmax agreement {same:.3f}")
    return 0 if rel.max() < a.tol else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
