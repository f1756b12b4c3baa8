"""Loads a qwen3moe GGUF (the shipped model, say) into train/model.py's Model:
the teacher a draft model is distilled from (train.py --teacher). The names
are train/export_gguf.py's, read backwards; the weights are dequantized by the
NumPy reference's decoders (tests/ref/moex_ref.py), so a Q8_0 file loads as
the values MoEx computes with.
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from moex_ref import GGUF, HParams  # noqa: E402
from model import Config, Model  # noqa: E402

# GGUF name in block il -> this model's parameter name
BLOCK_NAMES = {
    "attn_norm.weight": "attn_norm.weight", "attn_q.weight": "attn.wq.weight", "attn_k.weight": "attn.wk.weight",
    "attn_v.weight": "attn.wv.weight", "attn_output.weight": "attn.wo.weight",
    "attn_q_norm.weight": "attn.q_norm.weight", "attn_k_norm.weight": "attn.k_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight", "ffn_gate_inp.weight": "moe.router.weight",
    "ffn_gate_exps.weight": "moe.gate", "ffn_up_exps.weight": "moe.up", "ffn_down_exps.weight": "moe.down",
}


def load_teacher(path, device):
    """The GGUF's model on device, in eval mode, gradients off."""
    g = GGUF(path)
    hp = HParams(g)
    if hp.arch != "qwen3moe":
        sys.exit(f"teacher.py: {path} is {hp.arch}; the teacher must be a qwen3moe model")
    ctx = int(g.kv.get("qwen3moe.context_length", 512))
    ff = g.tensors["blk.0.ffn_gate_exps.weight"].ne[1]
    cfg = Config(n_vocab=hp.n_vocab, n_layer=hp.n_layer, n_embd=hp.n_embd, n_head=hp.n_head, n_head_kv=hp.n_head_kv,
                 head_dim=hp.head_dim, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, n_ff_exp=ff,
                 rope_base=hp.rope_base, rms_eps=hp.eps, n_ctx=ctx)
    state = {"tok_embd.weight": g.load("token_embd.weight"), "output_norm.weight": g.load("output_norm.weight")}
    for il in range(hp.n_layer):
        for gname, pname in BLOCK_NAMES.items():
            state[f"blocks.{il}.{pname}"] = g.load(f"blk.{il}.{gname}")
    model = Model(cfg)
    own = model.state_dict()
    for k, v in state.items():
        if tuple(own[k].shape) != v.shape:
            sys.exit(f"teacher.py: {k}: {v.shape} in the file, {tuple(own[k].shape)} in the model")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in state.items()})
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, cfg
