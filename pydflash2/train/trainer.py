"""The training loop: time-budgeted, checkpointed, resumable, with a tqdm bar.

The drafter, its frozen tables and every batch live on the training device
(parallel.py); on CUDA the step runs under bf16 autocast. Under `torchrun`:
- DistributedDataParallel wraps the drafter together with its whole loss
  (`Objective`, the selector's included), so every trained parameter is used
  inside DDP's forward;
- the global batch of a step is a function of the seed and the step alone
  (`GlobalOrder`), and each rank reads only its interleaved slice of it (over
  an epoch: its shard of the sequences), with anchors seeded per sequence;
  each rank's loss is normalised by the whole global batch's weights, so N
  ranks compute the gradient one process computes on the same global batch;
- rank 0 owns the clock: it broadcasts the budget fraction every step, so all
  ranks run the same steps with the same learning rate and stop together;
- rank 0 alone writes checkpoints and logs; every rank resumes from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from .dataset import Dataset
from .model import DFlash2Drafter, DrafterConfig
from .objective import Batch, Losses, LossOptions, compute_losses, expected_tau, lr_at, sample_batch
from .parallel import Parallel
from .target import frozen_tables, output_norm, target_layer_weights

CHECKPOINT = "checkpoint.pt"
LOG_EVERY = 20  # steps between log lines (the only steps that wait for the device)


@dataclass
class TrainSettings:
    max_minutes: float = 60.0
    max_steps: int = 0  # 0: no step limit (the time budget decides)
    batch_seqs: int = 8  # the global batch: sequences per step over all ranks
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


def build_model(cfg: DrafterConfig, target: str | Path, device: torch.device | str = "cpu",
                init_layers: list[int] | None = None) -> DFlash2Drafter:
    """init_layers: target layer ids the drafter layers start from (None: random init)."""
    emb, head = frozen_tables(target)
    model = DFlash2Drafter(cfg, emb, head)
    if init_layers:
        init_from_target(model, target, init_layers)
    norm = output_norm(target)
    if norm is not None and norm.shape == (cfg.n_embd,):
        with torch.no_grad():
            model.norm.weight.copy_(torch.as_tensor(np.array(norm, dtype=np.float32)))  # writable copy of the GGUF map
    model._full_head = head  # rows for exports with another draft vocabulary (stays on the host)
    return model.to(device)


def split_sequences(data: Dataset, n_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) sequence ids of a run: fixed by the seed and the dataset's size."""
    ids = np.random.default_rng(seed + 12345).permutation(len(data))
    n_val = min(n_val, len(data) // 10)
    return ids[n_val:], ids[:n_val]


class GlobalOrder:
    """The sequences of every step's global batch: epochs of seeded permutations of the
    training ids, `batch` ids per step. A function of (seed, step) only, so a resumed run
    and a run on any number of ranks see the same batches."""

    def __init__(self, ids: np.ndarray, batch: int, seed: int) -> None:
        self.ids, self.batch, self.seed = np.asarray(ids), batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = np.random.default_rng((self.seed, epoch)).permutation(self.ids)
        return self._perms[epoch]

    def step_ids(self, step: int) -> np.ndarray:
        n = len(self.ids)
        return np.array([self._perm(k // n)[k % n] for k in range(step * self.batch, (step + 1) * self.batch)])


def anchor_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def offline_batches(data: Dataset, train_ids: np.ndarray, s: TrainSettings, par: Parallel,
                    block: int) -> Callable[[int], Batch]:
    """step -> this rank's slice of the step's global batch (host tensors, f16 features)."""
    order = GlobalOrder(train_ids, min(s.batch_seqs, len(train_ids)), s.seed)

    def batch(step: int) -> Batch:
        ids = order.step_ids(step)[par.rank :: par.world]
        return sample_batch(data, None, len(ids), s.anchors, block, seq_ids=ids, anchor_seed=anchor_seed(s.seed, step))

    return batch


class Objective(nn.Module):
    """The drafter and its whole loss in one module: what DDP wraps."""

    def __init__(self, model: DFlash2Drafter, s: TrainSettings, par: Parallel) -> None:
        super().__init__()
        self.model, self.s, self.par = model, s, par

    def forward(self, batch: Batch) -> Losses:
        par = self.par
        return compute_losses(self.model, batch, loss_options(self.s),
                              global_sum=par.global_sum if par.distributed else None, ranks=par.world)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; full precision elsewhere (CPU autocast is slow, MPS bf16 partial)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_and_grads(objective: nn.Module, batch: Batch, device: torch.device, params: list[nn.Parameter]) -> Losses:
    """Forward (bf16 autocast on CUDA), backward and gradient clipping of one step."""
    with autocast(device):
        loss = objective(batch)
    loss.total.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    return loss


@torch.no_grad()
def evaluate(model: DFlash2Drafter, data: Dataset, val_ids: np.ndarray, s: TrainSettings) -> dict:
    """Loss and per-position accuracy on the held-out sequences (fixed anchors)."""
    if len(val_ids) == 0:
        return {}
    model.eval()
    rng = np.random.default_rng(7)
    vals = []
    device = model.embed.device
    lopts = loss_options(s)
    for i in range(0, len(val_ids), s.batch_seqs):
        b = sample_batch(data, rng, s.batch_seqs, s.anchors, model.config.block_size,
                         seq_ids=val_ids[i : i + s.batch_seqs])
        with autocast(device):
            vals.append(compute_losses(model, b, lopts).values())
    model.train()
    acc = np.mean([v["acc"] for v in vals], axis=0).tolist()
    path_acc = np.mean([v["path_acc"] for v in vals], axis=0).tolist()
    return {"val_ce": float(np.mean([v["ce"] for v in vals])), "val_soft_kl": float(np.mean([v["soft"] for v in vals])),
            "val_selector": float(np.mean([v["selector"] for v in vals])), "val_acc": acc, "val_path_acc": path_acc,
            "val_tau_est": expected_tau(path_acc)}


def train(model: DFlash2Drafter, data: Dataset, out: Path, s: TrainSettings, *, par: Parallel | None = None,
          resume: bool = False, progress: bool | None = None, batches: Callable[[int], Batch] | None = None,
          val_ids: np.ndarray | None = None) -> dict:
    """Trains until the time budget (or max_steps) is spent; returns the summary (rank 0's is complete).

    batches: step -> this rank's batch (default: offline batches of `data`'s training split);
    val_ids: held-out sequences of `data` (default: that split's)."""
    par = par or Parallel(model.embed.device)
    device = par.device
    if s.threads:
        torch.set_num_threads(s.threads)
    if par.distributed and s.batch_seqs % par.world:
        raise ValueError(f"--batch {s.batch_seqs} must be a multiple of the {par.world} ranks")
    train_ids, split_val = split_sequences(data, s.val_seqs, s.seed)
    val_ids = split_val if val_ids is None else val_ids
    batches = batches or offline_batches(data, train_ids, s, par, model.config.block_size)
    objective: nn.Module = Objective(model, s, par)
    if par.distributed:
        # the frozen tables are buffers: broadcasting them every step would move the vocabulary around
        objective = nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))
    step, elapsed, log = 0, 0.0, []
    ckpt_path = out / CHECKPOINT
    if resume and ckpt_path.exists():
        st = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, elapsed, log = st["step"], st["elapsed"], st["log"]
    budget = s.max_minutes * 60.0

    def frac() -> float:
        f = elapsed / budget if budget > 0 else 0.0
        return max(f, step / s.max_steps if s.max_steps else 0.0)

    def save() -> None:
        if not par.is_main:
            return
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "log": log, "config": model.config.to_dict(),
                    "settings": {k: v for k, v in asdict(s).items() if k != "log"}}, tmp)
        os.replace(tmp, ckpt_path)

    bar = tqdm(total=100.0, initial=round(100 * min(frac(), 1.0), 1), desc="training", unit="%", mininterval=2.0,
               bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f}% [{elapsed}<{remaining}]{postfix}",
               disable=(None if progress is None else not progress) if par.is_main else True)
    last_ckpt = time.monotonic()
    ema: torch.Tensor | None = None
    ema_value: float | None = None
    model.train()
    while True:
        f = par.broadcast_float(frac())  # rank 0's clock decides for every rank
        if f >= 1.0:
            break
        t0 = time.monotonic()
        for g in opt.param_groups:
            g["lr"] = s.lr * lr_at(f)
        batch = batches(step)
        opt.zero_grad(set_to_none=True)
        loss = loss_and_grads(objective, batch, device, params)
        opt.step()
        step += 1
        total = loss.total.detach()
        ema = total if ema is None else 0.95 * ema + 0.05 * total
        elapsed += time.monotonic() - t0
        if step % LOG_EVERY == 0 or step == 1:
            v = _global_values(loss, ema, par)
            ema_value = v["ema"]
            log.append({"step": step, "elapsed_s": round(elapsed, 1), "loss": round(v["ema"], 4),
                        "ce": round(v["ce"], 4), "soft_kl": round(v["soft"], 4), "selector": round(v["selector"], 4),
                        "acc1": round(v["acc"][0], 3), "tau_est": round(expected_tau(v["path_acc"]), 3),
                        "lr": opt.param_groups[0]["lr"]})
            bar.set_postfix_str(f"step {step} loss {v['ema']:.3f} ce {v['ce']:.3f} sel {v['selector']:.3f} "
                                f"acc1 {v['acc'][0]:.2f} tau~{expected_tau(v['path_acc']):.2f}", refresh=False)
        bar.update(round(100 * min(frac(), 1.0), 1) - bar.n)  # redraws at most every mininterval
        if par.is_main and time.monotonic() - last_ckpt > s.checkpoint_minutes * 60:
            save()
            last_ckpt = time.monotonic()
    bar.close()
    if ema is not None and (step % LOG_EVERY != 0 and step != 1):
        ema_value = _global_values(loss, ema, par)["ema"]  # every rank: it is a collective
    if par.distributed:
        print(f"[pydflash2 train] rank {par.rank}/{par.world} stopped after {step} steps", file=sys.stderr, flush=True)
    summary = {"steps": step, "train_seconds": round(elapsed, 1), "final_loss": ema_value,
               "last": log[-1] if log else {}}
    if par.is_main:
        summary.update(evaluate(model, data, val_ids, s))
        log.append({"step": step, "elapsed_s": round(elapsed, 1), **{k: v for k, v in summary.items() if k != "last"}})
        save()
        (out / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return summary


def _global_values(loss: Losses, ema: torch.Tensor, par: Parallel) -> dict:
    """The step's numbers averaged over the ranks (each rank's loss is its share of the global
    batch's, so the average is the global batch's loss; accuracies are the ranks' mean)."""
    scalars = torch.stack([ema.float(), loss.total.detach().float(), loss.ce.float(), loss.soft.float(),
                           loss.selector.float(), loss.sel_acc.float()])
    vec = torch.cat([scalars, loss.acc.float(), loss.path_acc.float()])
    vec = par.global_sum(vec) / par.world if par.distributed else vec
    x = vec.tolist()
    n = loss.acc.numel()
    return {"ema": x[0], "total": x[1], "ce": x[2], "soft": x[3], "selector": x[4], "sel_acc": x[5],
            "acc": x[6 : 6 + n], "path_acc": x[6 + n :]}
