"""A Qwen3-MoE transformer in PyTorch that computes what engine/forward.c
computes (and tests/ref/moex_ref.py in NumPy), so that its weights exported
to GGUF (train/export_gguf.py) run unchanged in MoEx and llama.cpp:

  x = token_embd[ids]
  per layer:
    h = rmsnorm(x) * attn_norm
    q, k, v = h Wq, h Wk, h Wv                     (GQA: n_head_kv <= n_head)
    q, k = rmsnorm per head * q_norm / k_norm       (qk-norm)
    q, k = rope(q, k), neox style (pairs i, i + head_dim/2), base rope_base
    x += softmax(q k^T / sqrt(head_dim), causal) v Wo
    h = rmsnorm(x) * ffn_norm
    p = softmax(h Wr) over all experts; the top-k, renormalised to sum 1
    x += sum_j p_j * down_j(silu(gate_j h) * up_j h)
  logits = rmsnorm(x) * output_norm @ token_embd^T  (tied output)

Linear weights are stored [out, in] as GGUF's [ne0 = in, ne1 = out]; expert
weights [expert, out, in] as GGUF's merged [in, out, expert].
"""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 32000
    n_layer: int = 6
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_exp: int = 64
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    n_ctx: int = 512          # the training sequence length, written as context_length

    def dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(n_pos, head_dim, base, device):
    """cos/sin of pos * base^(-2i/head_dim) for the pairs (i, i + head_dim/2)."""
    half = head_dim // 2
    inv = base ** (-2.0 * torch.arange(half, dtype=torch.float64, device=device) / head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x: (B, heads, T, head_dim); neox style: rotate (a, b) = (x[:half], x[half:])."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    c, s = cos[None, None], sin[None, None]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1).to(x.dtype)


def causal_attention(q, k, v):
    """q: (B, H, T, D), k/v: (B, H, T, D) (already repeated for GQA)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[2]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return att @ v


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.wq = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, _ = x.shape
        q = self.q_norm(self.wq(x).view(B, T, c.n_head, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.wk(x).view(B, T, c.n_head_kv, c.head_dim)).transpose(1, 2)
        v = self.wv(x).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = c.n_head // c.n_head_kv   # query head h reads kv head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, c.n_head * c.head_dim)
        return self.wo(y)


class MoE(nn.Module):
    """Router + experts. `dense` computes every expert for every token and
    zeroes the unchosen ones (batched products, fast on a GPU); otherwise each
    expert runs on its own tokens (less arithmetic, for the CPU). Both compute
    the same function."""

    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.router = nn.Linear(c.n_embd, c.n_expert, bias=False)
        self.gate = nn.Parameter(torch.empty(c.n_expert, c.n_ff_exp, c.n_embd))
        self.up = nn.Parameter(torch.empty(c.n_expert, c.n_ff_exp, c.n_embd))
        self.down = nn.Parameter(torch.empty(c.n_expert, c.n_embd, c.n_ff_exp))
        self.dense = False

    def route(self, h):
        """h: (N, d) -> router logits (N, E) in float32, ids (N, k), weights (N, k)."""
        with torch.autocast(h.device.type, enabled=False):   # the router in float32, as inference runs it
            logits = F.linear(h.float(), self.router.weight.float())
        probs = logits.softmax(-1)
        w, ids = probs.topk(self.c.n_expert_used, dim=-1)
        return logits, ids, w / w.sum(-1, keepdim=True)

    def forward(self, x):
        B, T, d = x.shape
        h = x.reshape(-1, d)
        logits, ids, w = self.route(h)
        if self.dense:
            gates = torch.zeros(h.shape[0], self.c.n_expert, device=h.device, dtype=torch.float32)
            gates.scatter_(1, ids, w)
            g = torch.einsum("nd,efd->nef", h, self.gate.to(h.dtype))
            u = torch.einsum("nd,efd->nef", h, self.up.to(h.dtype))
            a = F.silu(g) * u * gates.to(h.dtype)[:, :, None]
            out = torch.einsum("nef,edf->nd", a, self.down.to(h.dtype))
        else:
            out = torch.zeros_like(h)
            for e in range(self.c.n_expert):
                tok, slot = (ids == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                xe = h[tok]
                ye = F.linear(F.silu(F.linear(xe, self.gate[e])) * F.linear(xe, self.up[e]), self.down[e])
                out.index_add_(0, tok, ye * w[tok, slot, None].to(ye.dtype))
        return out.view(B, T, d), logits, ids


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.attn = Attention(c)
        self.ffn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.moe = MoE(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        y, logits, ids = self.moe(self.ffn_norm(x))
        return x + y, logits, ids


class Model(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(c.n_vocab, c.n_embd)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.output_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.reset_parameters()

    def reset_parameters(self):
        std, c = 0.02, self.c
        resid = std / math.sqrt(2 * c.n_layer)   # projections into the residual stream
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("attn.wo.weight") or name.endswith("moe.down"):
                nn.init.normal_(p, 0.0, resid)
            else:
                nn.init.normal_(p, 0.0, std)

    def set_dense_experts(self, dense):
        for b in self.blocks:
            b.moe.dense = dense

    def forward(self, ids):
        """ids: (B, T) -> logits (B, T, V), per layer router logits (N, E) and chosen ids (N, k)."""
        T = ids.shape[1]
        cos, sin = rope_tables(T, self.c.head_dim, self.c.rope_base, ids.device)
        x = self.tok_embd(ids)
        routers, chosen = [], []
        for b in self.blocks:
            x, lg, ch = b(x, cos, sin)
            routers.append(lg)
            chosen.append(ch)
        x = self.output_norm(x)
        return F.linear(x, self.tok_embd.weight.to(x.dtype)), routers, chosen


def load_balancing_loss(router_logits, chosen, n_expert):
    """Qwen3-MoE's (and Switch Transformer's) auxiliary loss over all layers:
    E * sum_e f_e * P_e, f_e the fraction of (token, slot) picks that went to
    expert e, P_e the mean router probability of e (transformers'
    load_balancing_loss_func). k when routing is uniform."""
    logits = torch.cat(router_logits, 0)
    probs = logits.softmax(-1)
    mask = F.one_hot(torch.cat(chosen, 0), n_expert).float()      # (N, k, E)
    tokens_per_expert = mask.mean(0)                                # (k, E)
    prob_per_expert = probs.mean(0)                                 # (E,)
    return n_expert * (tokens_per_expert * prob_per_expert[None]).sum()
