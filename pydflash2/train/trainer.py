"""The training loop: time-budgeted, checkpointed, resumable, with a tqdm bar.

Single process on the CPU by default. Under `torchrun` (WORLD_SIZE > 1) the same
loop wraps the model in DistributedDataParallel; each rank samples its own
batches and rank 0 alone writes checkpoints and exports.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .dataset import Dataset
from .model import DFlash2Drafter, DrafterConfig
from .objective import LossOptions, compute_losses, expected_tau, lr_at, sample_batch
from .target import frozen_tables, output_norm, target_layer_weights

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainSettings:
    max_minutes: float = 60.0
    max_steps: int = 0  # 0: no step limit (the time budget decides)
    batch_seqs: int = 8
    anchors: int = 24
    lr: float = 1.5e-3
    weight_decay: float = 0.01
    gamma: float = 4.0
    selector_weight: float = 1.0
    soft_weight: float = 0.0  # share of the soft-label KL in the token loss (needs a dataset with top-k)
    selector_gold_slot: bool = True
    selector_decay: bool = False
    selector_backbone: bool = False
    checkpoint_minutes: float = 5.0
    seed: int = 0
    threads: int = 0  # 0: torch's default
    val_seqs: int = 24
    log: list[dict] = field(default_factory=list)


def loss_options(s: TrainSettings) -> LossOptions:
    return LossOptions(gamma=s.gamma, selector_weight=s.selector_weight, soft_weight=s.soft_weight,
                       selector_gold_slot=s.selector_gold_slot, selector_decay=s.selector_decay,
                       selector_backbone=s.selector_backbone)


def init_from_target(model: DFlash2Drafter, target: str | Path, layers: list[int]) -> None:
    """Drafter layer i starts as target layer layers[i] (attention, MLP, both norms; the local
    convolutions stay the identity, so the layer computes the target layer's function)."""
    if len(layers) != len(model.layers):
        raise ValueError(f"{len(model.layers)} drafter layer(s) need as many target layers, got {layers}")
    for layer, tl in zip(model.layers, layers, strict=True):
        weights = target_layer_weights(target, tl)
        own = layer.state_dict()
        for name, w in weights.items():
            if own[name].shape != w.shape:
                raise ValueError(f"target layer {tl}'s {name} is {list(w.shape)}, the drafter's "
                                 f"{list(own[name].shape)}: give the drafter the target's layer shape")
        with torch.no_grad():
            for name, w in weights.items():
                own[name].copy_(torch.from_numpy(w))


def build_model(cfg: DrafterConfig, target: str | Path, init_layers: list[int] | None = None) -> DFlash2Drafter:
    """init_layers: target layer ids the drafter layers start from (None: random init)."""
    emb, head = frozen_tables(target)
    model = DFlash2Drafter(cfg, emb, head)
    if init_layers:
        init_from_target(model, target, init_layers)
    norm = output_norm(target)
    if norm is not None and norm.shape == (cfg.n_embd,):
        with torch.no_grad():
            model.norm.weight.copy_(torch.as_tensor(np.array(norm, dtype=np.float32)))  # writable copy of the GGUF map
    model._full_head = head  # rows for exports with another draft vocabulary
    return model


def split_sequences(data: Dataset, n_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) sequence ids of a run: fixed by the seed and the dataset's size."""
    ids = np.random.default_rng(seed + 12345).permutation(len(data))
    n_val = min(n_val, len(data) // 10)
    return ids[n_val:], ids[:n_val]


@torch.no_grad()
def evaluate(model: DFlash2Drafter, data: Dataset, val_ids: np.ndarray, s: TrainSettings) -> dict:
    """Loss and per-position accuracy on the held-out sequences (fixed anchors)."""
    if len(val_ids) == 0:
        return {}
    model.eval()
    rng = np.random.default_rng(7)
    ces, softs, sels, accs, walks = [], [], [], [], []
    for i in range(0, len(val_ids), s.batch_seqs):
        b = sample_batch(data, rng, s.batch_seqs, s.anchors, model.config.block_size,
                         seq_ids=val_ids[i : i + s.batch_seqs])
        loss = compute_losses(model, b, loss_options(s))
        ces.append(loss.ce.item())
        softs.append(loss.soft.item())
        sels.append(loss.selector.item())
        accs.append(loss.acc.tolist())
        walks.append(loss.walk_acc.tolist())
    model.train()
    acc = np.mean(np.asarray(accs), axis=0).tolist()
    walk = np.mean(np.asarray(walks), axis=0).tolist()
    return {"val_ce": float(np.mean(ces)), "val_soft_kl": float(np.mean(softs)), "val_selector": float(np.mean(sels)),
            "val_acc": acc, "val_walk_acc": walk, "val_tau_est": expected_tau(walk)}


def train(model: DFlash2Drafter, data: Dataset, out: Path, s: TrainSettings, *, resume: bool = False,
          progress: bool | None = None) -> dict:
    """Trains until the time budget (or max_steps) is spent; returns the summary."""
    if s.threads:
        torch.set_num_threads(s.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    ddp_model: torch.nn.Module = model
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))
    train_ids, val_ids = split_sequences(data, s.val_seqs, s.seed)
    step, elapsed, log = 0, 0.0, []
    rng = np.random.default_rng(s.seed + rank)
    ckpt_path = out / CHECKPOINT
    if resume and ckpt_path.exists():
        st = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, elapsed, log = st["step"], st["elapsed"], st["log"]
        rng.bit_generator.state = st["rng"]
    budget = s.max_minutes * 60.0

    def frac() -> float:
        f = elapsed / budget if budget > 0 else 0.0
        return max(f, step / s.max_steps if s.max_steps else 0.0)

    def save() -> None:
        if rank != 0:
            return
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "log": log, "rng": rng.bit_generator.state, "config": model.config.to_dict(),
                    "settings": {k: v for k, v in asdict(s).items() if k != "log"}}, tmp)
        os.replace(tmp, ckpt_path)

    bar = tqdm(total=100.0, initial=round(100 * min(frac(), 1.0), 1), desc="training", unit="%", mininterval=2.0,
               bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f}% [{elapsed}<{remaining}]{postfix}",
               disable=(None if progress is None else not progress) if rank == 0 else True)
    last_ckpt = time.monotonic()
    ema: torch.Tensor | None = None  # a tensor: the step reads nothing back to the host but at log steps
    lopts = loss_options(s)
    model.train()
    while frac() < 1.0:
        t0 = time.monotonic()
        for g in opt.param_groups:
            g["lr"] = s.lr * lr_at(frac())
        batch = sample_batch(data, rng, s.batch_seqs, s.anchors, model.config.block_size,
                             seq_ids=rng.choice(train_ids, size=min(s.batch_seqs, len(train_ids)), replace=False))
        loss = compute_losses(model, batch, lopts, forward=ddp_model)
        opt.zero_grad(set_to_none=True)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        step += 1
        elapsed += time.monotonic() - t0
        t = loss.total.detach()
        ema = t if ema is None else 0.95 * ema + 0.05 * t
        if step % 20 == 0 or step == 1:
            walk = loss.walk_acc.tolist()
            log.append({"step": step, "elapsed_s": round(elapsed, 1), "loss": round(ema.item(), 4),
                        "ce": round(loss.ce.item(), 4), "soft_kl": round(loss.soft.item(), 4),
                        "selector": round(loss.selector.item(), 4), "acc1": round(loss.acc[0].item(), 3),
                        "tau_est": round(expected_tau(walk), 3), "lr": opt.param_groups[0]["lr"]})
            e = log[-1]
            bar.set_postfix_str(f"step {step} loss {e['loss']:.3f} ce {e['ce']:.3f} sel {e['selector']:.3f} "
                                f"acc1 {e['acc1']:.2f} tau~{e['tau_est']:.2f}", refresh=False)
        bar.update(round(100 * min(frac(), 1.0), 1) - bar.n)  # redraws at most every mininterval
        if time.monotonic() - last_ckpt > s.checkpoint_minutes * 60:
            save()
            last_ckpt = time.monotonic()
    bar.close()
    summary = {"steps": step, "train_seconds": round(elapsed, 1), "final_loss": None if ema is None else ema.item(),
               "last": log[-1] if log else {}}
    summary.update(evaluate(model, data, val_ids, s))
    log.append({"step": step, "elapsed_s": round(elapsed, 1), **{k: v for k, v in summary.items() if k != "last"}})
    save()
    if rank == 0:
        (out / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return summary
