"""The training objective: random anchors, position-decayed cross-entropy on the
target's own tokens (hard labels) mixed with the KL to the target's stored top-k
distribution (soft labels), and the selector's loss over its k candidates.

For an anchor at position p the block is [t_p, MASK...] at p..p+n-1; it sees
the features of positions < p (what the runtime has injected when it drafts
from p) and block position k predicts t_{p+k}, with weight exp(-(k-1)/gamma).
Anchors are drawn from the continuation only, so every label is a token the
target itself chose greedily. The selector is trained as Model-Optimizer's DFlash2
trainer does: when the gold token is not among the unary top-k, it replaces the
last candidate, so every position teaches the selector, not only the easy ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

from ..draft_decision import expected_tokens
from .dataset import Dataset
from .model import DFlash2Drafter


@dataclass
class Batch:
    feats: torch.Tensor  # [B, Lc, width] float16 as sampled (half the bytes to copy), float32 once on the device
    ctx_valid: torch.Tensor  # [B, Lc] bool
    anchor_pos: torch.Tensor  # [B, A] long
    anchor_tok: torch.Tensor  # [B, A] long
    labels: torch.Tensor  # [B, A, n] target ids of t_{p+k} (k = 0 unused), -100 past the end
    anchor_valid: torch.Tensor  # [B, A] bool
    # the target's top-k distribution of t_{p+k} (soft labels), when the dataset keeps them:
    soft_ids: torch.Tensor | None = None  # [B, A, n, k] target ids, -1 where none
    soft_logp: torch.Tensor | None = None  # [B, A, n, k] float32 log-probabilities

    def to(self, device: torch.device) -> Batch:
        """Every field on `device`; the f16 features are upcast to float32 there."""
        moved = {f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                 for f in fields(self)}
        moved["feats"] = moved["feats"].float()
        return Batch(**moved)


def sample_batch(data: Dataset, rng: np.random.Generator | None, n_seqs: int, n_anchors: int, block: int,
                 seq_ids: np.ndarray | None = None, anchor_seed: int | None = None) -> Batch:
    """n_seqs random sequences (or seq_ids), up to n_anchors random anchors each.
    anchor_seed: each sequence's anchors come from its own generator, seeded by
    (anchor_seed, sequence id), so they do not depend on which rank samples it."""
    ids = seq_ids if seq_ids is not None else rng.choice(len(data), size=min(n_seqs, len(data)), replace=False)
    picked = []
    for i in ids:
        tokens, feats, plen = data.sequence(int(i))
        lo, hi = max(plen - 1, 0), len(tokens) - 2  # anchor p in [lo, hi]: label p+1 exists
        if hi < lo:
            continue
        cands = np.arange(lo, hi + 1)
        r = rng if anchor_seed is None else np.random.default_rng((anchor_seed, int(i)))
        anchors = np.sort(r.choice(cands, size=min(n_anchors, len(cands)), replace=False))
        picked.append((int(i), np.asarray(tokens, dtype=np.int64), feats, anchors))
    if not picked:
        raise ValueError("no sequence has a continuation of 2 tokens or more")
    B = len(picked)
    Lc = max(int(a[-1]) for _, _, _, a in picked)  # context rows needed: positions < max anchor
    Lc = max(Lc, 1)
    A = max(len(a) for _, _, _, a in picked)
    K = data.top_k
    feats = np.zeros((B, Lc, data.width), dtype=np.float16)
    valid = np.zeros((B, Lc), dtype=bool)
    apos = np.zeros((B, A), dtype=np.int64)
    atok = np.zeros((B, A), dtype=np.int64)
    aval = np.zeros((B, A), dtype=bool)
    labels = np.full((B, A, block), -100, dtype=np.int64)
    soft_ids = np.full((B, A, block, K), -1, dtype=np.int64)
    soft_logp = np.zeros((B, A, block, K), dtype=np.float32)
    for b, (i, tokens, f, anchors) in enumerate(picked):
        m = min(Lc, int(anchors[-1]))
        feats[b, :m] = f[:m]
        valid[b, :m] = True
        L = len(tokens)
        sid, slp = data.soft_labels(i) if K else (None, None)
        for a, p in enumerate(anchors):
            apos[b, a], atok[b, a], aval[b, a] = p, tokens[p], True
            end = min(L, p + block)
            labels[b, a, 1 : end - p] = tokens[p + 1 : end]
            if K:  # row j holds the distribution of token j+1
                soft_ids[b, a, 1 : end - p] = sid[p : end - 1]
                soft_logp[b, a, 1 : end - p] = slp[p : end - 1]
    t = torch.from_numpy
    soft = (t(soft_ids), t(soft_logp)) if K else (None, None)
    return Batch(t(feats), t(valid), t(apos), t(atok), t(labels), t(aval), *soft)


@dataclass
class LossOptions:
    """What the objective weighs; the defaults are the recipe's (docs/training.md)."""

    gamma: float = 4.0  # decay of the token losses over block positions (0: none)
    selector_weight: float = 1.0
    soft_weight: float = 0.0  # 0: hard labels only; 1: KL to the target's stored top-k only; between: the mix
    selector_gold_slot: bool = True  # a gold token outside the candidates replaces the last one
    selector_decay: bool = False  # decay-weight the selector loss like the token losses
    selector_backbone: bool = False  # the selector loss also trains the layers (not detached)


@dataclass
class Losses:
    """A step's loss and metrics. Everything but `total` is detached; all stay tensors on the
    training device, so computing them never waits for the device (`values()` reads them once)."""

    total: torch.Tensor
    ce: torch.Tensor  # hard-label cross-entropy
    soft: torch.Tensor  # KL(target's top-k || drafter), 0 without soft labels
    selector: torch.Tensor
    acc: torch.Tensor  # [n-1] top-1 accuracy of the unary logits per block position 1..n-1
    sel_acc: torch.Tensor  # selector picks the true token given the true predecessor (when among candidates)
    # [n-1] per block position: the greedy selector's pick (DFlash2: best candidate score given the true
    # predecessor; DFlash: the unary top-1) is the true token. This, not `acc`, is what the
    # engine's acceptance follows: the selector often corrects the unary top-1.
    path_acc: torch.Tensor

    def values(self) -> dict:
        """Plain numbers: {"total", "ce", "soft", "selector", "sel_acc": float, "acc", "path_acc": list}."""
        n = self.acc.numel()
        scalars = torch.stack([self.total.detach(), self.ce, self.soft, self.selector, self.sel_acc]).float()
        flat = torch.cat([scalars, self.acc.float(), self.path_acc.float()]).tolist()
        return {"total": flat[0], "ce": flat[1], "soft": flat[2], "selector": flat[3], "sel_acc": flat[4],
                "acc": flat[5 : 5 + n], "path_acc": flat[5 + n :]}


def soft_kl(logp_draft: torch.Tensor, soft_ids_d: torch.Tensor, soft_logp: torch.Tensor) -> torch.Tensor:
    """KL(q || p) per position: q is the target's stored top-k distribution renormalised over the
    entries inside the draft vocabulary (soft_ids_d >= 0), p the drafter's softmax (log: logp_draft
    [..., V]). Positions without any such entry give 0."""
    keep = soft_ids_d >= 0
    lq = torch.where(keep, soft_logp, torch.full_like(soft_logp, -torch.inf))
    lq = lq - torch.logsumexp(lq, dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    q = lq.exp().nan_to_num(0.0) * keep
    lp = logp_draft.gather(-1, soft_ids_d.clamp(min=0))
    return (q * (torch.where(keep, lq, torch.zeros_like(lq)) - lp)).sum(-1)


def compute_losses(model: DFlash2Drafter, batch: Batch, opts: LossOptions | None = None, *,
                   forward: torch.nn.Module | None = None,
                   global_sum: Callable[[torch.Tensor], torch.Tensor] | None = None, ranks: int = 1) -> Losses:
    """The batch goes to the model's device first. forward: what runs the model (a
    DistributedDataParallel wrapper under torchrun). global_sum/ranks (DistributedDataParallel): each
    rank's loss is normalised by the weights of the whole global batch (global_sum adds a number up
    over the ranks), so the average of the ranks' gradients is one process's gradient on that batch."""
    o = opts or LossOptions()
    c = model.config
    batch = batch.to(model.embed.device)
    n = batch.labels.shape[-1]

    def norm(x: torch.Tensor, floor: float) -> torch.Tensor:  # x's global total, per rank
        return (x if global_sum is None else global_sum(x)).clamp(min=floor) / ranks

    run = model if forward is None else forward  # not `forward or model`: a compiled module has no len()
    hidden, logits = run(batch.feats, batch.ctx_valid, batch.anchor_pos, batch.anchor_tok, n)
    lab = batch.labels[..., 1:]  # [B, A, n-1] target ids
    lab_d = torch.where(lab >= 0, model.t2d[lab.clamp(min=0)], torch.full_like(lab, -100))
    lg = logits[..., 1:, :]
    k = torch.arange(1, n, dtype=torch.float32, device=lg.device)
    w = torch.exp(-(k - 1) / o.gamma) if o.gamma > 0 else torch.ones_like(k)
    has = (lab >= 0).float()  # tokens outside the draft vocabulary count as misses, not as loss
    in_vocab = (lab_d >= 0).float()
    wsum = norm((w * has).sum(), 1.0)
    logp = F.log_softmax(lg.float(), dim=-1)
    ce = -logp.gather(-1, lab_d.clamp(min=0)[..., None])[..., 0]
    ce_loss = (ce * in_vocab * w).sum() / wsum
    zero = torch.zeros((), device=lg.device)
    soft_loss = zero
    token_loss = ce_loss
    if batch.soft_ids is not None and batch.soft_logp is not None and o.soft_weight > 0:  # structure, not data
        sid = batch.soft_ids[..., 1:, :]
        sid_d = torch.where(sid >= 0, model.t2d[sid.clamp(min=0)], torch.full_like(sid, -100))
        soft_loss = (soft_kl(logp, sid_d, batch.soft_logp[..., 1:, :]) * has * w).sum() / wsum
        token_loss = (1 - o.soft_weight) * ce_loss + o.soft_weight * soft_loss
    with torch.no_grad():
        n_has = has.flatten(0, -2).sum(0).clamp(min=1.0)  # [n-1]
        hit = ((lg.argmax(-1) == lab_d) & (lab_d >= 0)).float()
        acc = (hit * has).flatten(0, -2).sum(0) / n_has
    total = token_loss
    sel_loss, sel_acc, path_acc = zero, zero, acc
    if c.version == 2:
        kk = min(c.selector_top_k, lg.shape[-1])
        src = lg if o.selector_backbone else lg.detach()
        with torch.no_grad():
            cidx = lg.detach().topk(kk, dim=-1).indices  # draft-vocab indices
            if o.selector_gold_slot:  # the gold token, when not a candidate, takes the last slot
                gold_in = (cidx == lab_d[..., None]).any(-1) | (lab_d < 0)
                last = torch.where(gold_in, cidx[..., -1], lab_d.clamp(min=0))
                cidx = torch.cat([cidx[..., :-1], last[..., None]], dim=-1)
            cand = model.draft_ids[cidx]  # target ids [B, A, n-1, k]
            prev = torch.cat([batch.anchor_tok[..., None], batch.labels[..., 1:-1]], dim=-1).clamp(min=0)
            target = (cand == lab[..., None]).float()
            present = ((target.sum(-1) > 0) & (lab >= 0)).float()
            tgt = target.argmax(-1)
        unary = src.gather(-1, cidx)
        h = hidden[..., 1:, :] if o.selector_backbone else hidden[..., 1:, :].detach()
        scores = model.candidate_selector.scores(unary, cand, h, prev)
        with torch.no_grad():
            pick = cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
            path_acc = ((pick == lab).float() * has).flatten(0, -2).sum(0) / n_has
            sel_acc = ((scores.argmax(-1) == tgt).float() * present).sum() / present.sum().clamp(min=1.0)
        # masked, not indexed: every rank runs the same graph whether or not a gold token is present
        ws = (w if o.selector_decay else torch.ones_like(w)).expand_as(lab) * present
        sel_ce = F.cross_entropy(scores.reshape(-1, kk).float(), tgt.reshape(-1), reduction="none").view(lab.shape)
        sel_loss = (sel_ce * ws).sum() / norm(ws.sum(), 1e-12)
        total = total + o.selector_weight * sel_loss
    return Losses(total, ce_loss.detach(), soft_loss.detach(), sel_loss.detach(), acc, sel_acc, path_acc)


def expected_tau(acc: list[float]) -> float:
    """1 + sum_k prod_{j<=k} acc_j: committed tokens per step if position accuracies were independent
    (the engines' own formula, native draft_length.h, through the C API)."""
    return expected_tokens(acc)


def lr_at(frac: float, warmup: float = 0.03, floor: float = 0.1) -> float:
    """Learning-rate factor at a fraction of the (time) budget: warmup, then cosine to `floor`."""
    if frac < warmup:
        return max(frac / warmup, 0.01)
    t = min(1.0, (frac - warmup) / max(1e-9, 1 - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
