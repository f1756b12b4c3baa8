#!/usr/bin/python3
"""Trains the default MoEx model: a small Qwen3-MoE (train/model.py) on the
Brown Corpus prepared by train/prepare.sh, from scratch.

    train.py --preset full --out train/runs/full      (CUDA, a few minutes on an H100)
    train.py --preset tiny --out train/runs/tiny      (CPU, minutes on 2 cores)
    train.py --preset draft --out train/runs/draft    (CUDA: the draft model for speculative decoding,
                                                      distilled from the shipped model, --teacher)

Every run is a pure function of its flags and seed, up to the time budget:
training stops at --max-steps or when --time-budget seconds have passed,
whichever comes first, and the learning rate follows the larger of the two
fractions (warm-up, then cosine to 10 %). Training windows are random slices
of the training tokens whose first token is replaced by BOS, as llama.cpp's
perplexity does to each window it scores. Every 32nd block of 4096 training
tokens is kept back for validation; the weights with the best validation loss
are the ones saved. The held-out 5 % of documents (train/data/heldout.bin) is
scored only at the end, the llama.cpp way (second half of each window).

Writes to --out: weights-NN.pt (float16 shards of at most 15 MB, a bigger
tensor alone in its shard; for
train/export_gguf.py), run.json (model and training config, corpus split,
results), log.csv and loss.svg (the loss curve).
"""
import argparse
import copy
import csv
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from model import Config, Model, load_balancing_loss  # noqa: E402
from plot import loss_svg  # noqa: E402

BOS = 1                      # llama-spm's <s>
VAL_BLOCK, VAL_EVERY = 4096, 32
SHARD_BYTES = 15_000_000

PRESETS = {
    # The model that ships: ~19 M parameters (8.2 M of them the tied embedding), ~20 MB in Q8_0.
    "full": dict(model=dict(n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=32,
                            n_expert_used=4, n_ff_exp=64, n_ctx=512),
                 train=dict(batch=32, lr=3e-3, warmup=200, dropout=0.2, weight_decay=0.1, aux_coef=0.01,
                            time_budget=330, max_steps=3000, eval_every=200, eval_windows=64,
                            dense_experts=True)),
    # A stand-in for CPUs: the same architecture, fewer layers and experts.
    "tiny": dict(model=dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8,
                            n_expert_used=2, n_ff_exp=64, n_ctx=128),
                 train=dict(batch=16, lr=3e-3, warmup=50, dropout=0.0, weight_decay=0.1, aux_coef=0.01,
                            time_budget=240, max_steps=100000, eval_every=100, eval_windows=16,
                            dense_experts=False)),
    # The draft model for speculative decoding (moex-hub --draft-model): one layer, the same tokenizer,
    # distilled from the shipped model (loss: kd x KL(teacher || draft) + (1 - kd) x cross-entropy), its
    # embedding (most of its parameters) started from the teacher's, so that its guesses are the teacher's.
    "draft": dict(model=dict(n_layer=1, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8,
                             n_expert_used=2, n_ff_exp=128, n_ctx=512),
                  train=dict(batch=32, lr=2e-3, warmup=100, dropout=0.0, weight_decay=0.1, aux_coef=0.01,
                             time_budget=150, max_steps=3000, eval_every=200, eval_windows=64,
                             dense_experts=True, kd=0.9)),
}
DEFAULT_TEACHER = os.path.join(HERE, "model", "brown-moe-q8_0.gguf")


OPENBLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-pthread"


def use_openblas():
    """Debian's python3-torch does its CPU products through the system BLAS,
    by default the reference implementation (~35x slower than OpenBLAS). With
    libopenblas0-pthread installed, run again with OpenBLAS first on the
    library path, leaving the system's BLAS choice alone."""
    if os.path.isdir(OPENBLAS_DIR) and OPENBLAS_DIR not in os.environ.get("LD_LIBRARY_PATH", ""):
        env = dict(os.environ, LD_LIBRARY_PATH=OPENBLAS_DIR + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def log(msg):
    print(msg, flush=True)


def load_tokens(path):
    if not os.path.exists(path):
        sys.exit(f"train.py: {path} is missing: run train/prepare.sh first")
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def split_validation(tokens):
    """Every VAL_EVERY-th block of VAL_BLOCK tokens -> validation (at least one)."""
    n_blocks = len(tokens) // VAL_BLOCK
    blocks = tokens[:n_blocks * VAL_BLOCK].view(n_blocks, VAL_BLOCK)
    is_val = torch.arange(n_blocks) % VAL_EVERY == VAL_EVERY - 1
    if not is_val.any():   # a small corpus (tests): the last block
        is_val[-1] = True
    return blocks[~is_val].reshape(-1), blocks[is_val].reshape(-1)


def windows(tokens, seq, n=None):
    """Consecutive windows of seq tokens, the first of each replaced by BOS."""
    k = len(tokens) // seq
    if n is not None:
        k = min(k, n)
    w = tokens[:k * seq].view(k, seq).clone()
    w[:, 0] = BOS
    return w


def score(model, wins, device, batch, second_half):
    """Mean next-token NLL over windows; second_half: only positions >= seq/2
    predict (llama.cpp's perplexity), else every position."""
    model.eval()
    nll, count = 0.0, 0
    seq = wins.shape[1]
    first = seq // 2 if second_half else 0
    with torch.no_grad():
        for i in range(0, len(wins), batch):
            x = wins[i:i + batch].to(device)
            with autocast(device):
                logits, _, _ = model(x)
            lp = torch.log_softmax(logits[:, first:seq - 1].float(), -1)
            tgt = x[:, first + 1:]
            nll += -lp.gather(-1, tgt[..., None]).sum().item()
            count += tgt.numel()
    model.train()
    return nll / count


def top1_agreement(model, teacher, wins, device, batch):
    """The share of positions where the model's argmax is the teacher's (teacher forced)."""
    model.eval()
    same, count = 0, 0
    with torch.no_grad():
        for i in range(0, len(wins), batch):
            x = wins[i:i + batch].to(device)
            with autocast(device):
                a, b = model(x)[0].argmax(-1), teacher(x)[0].argmax(-1)
            same += (a == b).sum().item()
            count += a.numel()
    model.train()
    return same / count


def autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def lr_at(step, progress, t):
    if step < t["warmup"]:
        return t["lr"] * (step + 1) / t["warmup"]
    return t["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def save_shards(state, out):
    """float16 tensors in shards of at most SHARD_BYTES; returns the file names."""
    for f in os.listdir(out):
        if f.startswith("weights-") and f.endswith(".pt"):
            os.remove(os.path.join(out, f))
    shards, cur, size = [], {}, 0
    for name, t in state.items():
        t = t.detach().to("cpu", torch.float16).contiguous()
        nb = t.numel() * 2
        if cur and size + nb > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += nb
    shards.append(cur)
    names = []
    for i, s in enumerate(shards):
        names.append(f"weights-{i:02d}.pt")
        torch.save(s, os.path.join(out, names[-1]))
    return names


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: 1 on CPU, torch's default on CUDA)")
    for k in PRESETS["draft"]["train"]:
        if k != "dense_experts":
            ap.add_argument("--" + k.replace("_", "-"), type=type(PRESETS["draft"]["train"][k]), default=None)
    ap.add_argument("--teacher", default=None,
                    help=f"GGUF to distill from when kd > 0 (default {os.path.relpath(DEFAULT_TEACHER)})")
    ap.add_argument("--final-windows", type=int, default=0, help="held-out windows scored at the end (0: all)")
    return ap.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    preset = PRESETS[a.preset]
    t = dict(preset["train"])
    t.setdefault("kd", 0.0)
    for k in t:
        v = getattr(a, k, None)
        if v is not None:
            t[k] = v
    cfg = Config(**preset["model"])
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    if device.type == "cpu":
        use_openblas()
        torch.set_num_threads(a.threads or 1)   # OpenBLAS threads the products; more torch threads contend with it
    elif a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)

    train_all = load_tokens(os.path.join(a.data, "train.bin"))
    heldout = load_tokens(os.path.join(a.data, "heldout.bin"))
    train_tok, val_tok = split_validation(train_all)
    val_w = windows(val_tok, cfg.n_ctx, t["eval_windows"])
    train_dev = train_tok.to(device)
    seq = cfg.n_ctx

    model = Model(cfg).to(device)
    model.set_dense_experts(t["dense_experts"] and device.type == "cuda")
    teacher = None
    if t["kd"] > 0:
        from teacher import load_teacher
        teacher, tcfg = load_teacher(a.teacher or DEFAULT_TEACHER, device)
        teacher.set_dense_experts(device.type == "cuda")
        if tcfg.n_vocab != cfg.n_vocab or tcfg.n_embd != cfg.n_embd:
            sys.exit("train.py: the teacher's vocabulary and width must be the draft's")
        with torch.no_grad():
            model.tok_embd.weight.copy_(teacher.tok_embd.weight)
        log(f"train.py: distilling from {a.teacher or DEFAULT_TEACHER} ({tcfg.n_layer} layers), kd {t['kd']}")
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = dict(lr=t["lr"], betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames:
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)
    drop = torch.nn.Dropout(t["dropout"])
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    log(f"train.py: preset {a.preset} on {device} ({torch.__version__}), {n_params / 1e6:.2f} M params, "
        f"train {len(train_tok)} tokens, validation {len(val_tok)}, held-out {len(heldout)}; "
        f"batch {t['batch']} x {seq}, budget {t['time_budget']} s")

    rows, best = [], (float("inf"), None, 0)
    t0 = time.time()
    step, tokens_seen, ema = 0, 0, None
    while True:
        elapsed = time.time() - t0
        progress = max(step / t["max_steps"], elapsed / t["time_budget"])
        if progress >= 1.0:
            break
        lr = lr_at(step, progress, t)
        for g in opt.param_groups:
            g["lr"] = lr
        off = torch.randint(0, len(train_tok) - seq - 1, (t["batch"],), generator=gen)
        idx = (off[:, None] + torch.arange(seq + 1)[None]).to(device)
        batch = train_dev[idx]
        x, y = batch[:, :-1].clone(), batch[:, 1:]
        x[:, 0] = BOS
        with autocast(device):
            logits, routers, chosen = forward_with_dropout(model, x, drop)
            ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.n_vocab), y.reshape(-1))
            aux = load_balancing_loss(routers, chosen, cfg.n_expert)
            loss = ce + t["aux_coef"] * aux
            if teacher is not None:
                with torch.no_grad():
                    t_logp = torch.log_softmax(teacher(x)[0].float(), -1)
                s_logp = torch.log_softmax(logits.float(), -1)
                kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
                loss = (1 - t["kd"]) * ce + t["kd"] * kl + t["aux_coef"] * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        ce_v = ce.item() if step % 10 == 0 or step == 1 else None
        if ce_v is not None:
            ema = ce_v if ema is None else 0.9 * ema + 0.1 * ce_v
        if step % t["eval_every"] == 0 or step == 1:
            val = score(model, val_w, device, t["batch"], second_half=False)
            el = time.time() - t0
            rows.append(dict(step=step, tokens=tokens_seen, seconds=round(el, 2), lr=lr, train_loss=ce_v,
                             train_loss_ema=ema, aux_loss=aux.item(), val_loss=val))
            if val < best[0]:
                best = (val, copy.deepcopy({k: v.detach().to("cpu") for k, v in model.state_dict().items()}), step)
            log(f"step {step:6d}  tokens {tokens_seen / 1e6:7.2f} M  loss {ema:.3f}  aux {aux.item():.3f}  "
                f"val {val:.3f} (ppl {math.exp(val):.1f})  lr {lr:.2e}  {tokens_seen / max(el, 1e-9) / 1e3:.1f} k tok/s"
                f"  {el:.0f} s")
    train_s = time.time() - t0
    val = score(model, val_w, device, t["batch"], second_half=False)
    rows.append(dict(step=step, tokens=tokens_seen, seconds=round(train_s, 2), lr=lr, train_loss=None,
                     train_loss_ema=ema, aux_loss=None, val_loss=val))
    if val < best[0]:
        best = (val, {k: v.detach().to("cpu") for k, v in model.state_dict().items()}, step)
    model.load_state_dict(best[1])
    held_w = windows(heldout, seq, a.final_windows or None)
    held = score(model, held_w, device, t["batch"], second_half=True)
    log(f"train.py: {step} steps, {tokens_seen / 1e6:.1f} M tokens in {train_s:.0f} s; best validation loss "
        f"{best[0]:.4f} at step {best[2]}; held-out PPL (llama.cpp style, ctx {seq}, {len(held_w)} windows) "
        f"{math.exp(held):.3f}")
    agree = top1_agreement(model, teacher, held_w, device, t["batch"]) if teacher is not None else None
    if agree is not None:
        log(f"train.py: held-out top-1 equal to the teacher's at {100 * agree:.1f} % of positions")

    shards = save_shards(model.state_dict(), a.out)
    with open(os.path.join(a.out, "log.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "loss.svg"), "w") as f:
        f.write(loss_svg(rows, f"{a.preset}: {n_params / 1e6:.1f} M params, {cfg.n_layer} layers, "
                               f"{cfg.n_expert} experts top-{cfg.n_expert_used}"))
    split = os.path.join(a.data, "split.json")
    run = dict(preset=a.preset, model=cfg.dict(), train=t, seed=a.seed, device=str(device),
               torch=torch.__version__, n_params=n_params, steps=step, tokens=tokens_seen, train_seconds=train_s,
               best_step=best[2], best_val_loss=best[0], heldout_ppl=math.exp(held), heldout_windows=len(held_w),
               teacher_top1_agreement=agree,
               heldout_ctx=seq, validation=f"every {VAL_EVERY}th block of {VAL_BLOCK} training tokens",
               corpus=json.load(open(split)) if os.path.exists(split) else None, shards=shards)
    with open(os.path.join(a.out, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    log(f"train.py: wrote {', '.join(shards)}, run.json, log.csv, loss.svg to {a.out}")


def forward_with_dropout(model, x, drop):
    """The model's forward with dropout on what each block adds to the residual stream."""
    if drop.p == 0:
        return model(x)
    from model import rope_tables
    T = x.shape[1]
    cos, sin = rope_tables(T, model.c.head_dim, model.c.rope_base, x.device)
    h = model.tok_embd(x)
    routers, chosen = [], []
    for b in model.blocks:
        h = h + drop(b.attn(b.attn_norm(h), cos, sin))
        y, lg, ch = b.moe(b.ffn_norm(h))
        h = h + drop(y)
        routers.append(lg)
        chosen.append(ch)
    h = model.output_norm(h)
    return torch.nn.functional.linear(h, model.tok_embd.weight.to(h.dtype)), routers, chosen


if __name__ == "__main__":
    main(sys.argv[1:])
