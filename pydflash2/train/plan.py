"""What a training run needs, worked out before it runs (`pydflash2 train --dry-run`).

Reads only the target's GGUF metadata. The drafter's parameter count is exact:
the very model class a run trains is built on the meta device (no memory, no
weights) and its parameters are counted. Everything else is arithmetic on those
shapes, with the assumptions written next to each number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .model import DFlash2Drafter, DrafterConfig
from .target import TargetInfo

GIB = 2**30
FEATURE_BYTES = 2  # float16 per feature
TOKEN_BYTES = 4  # int32 per token id
H200_BYTES = 141e9  # one H200's HBM3e (vendor figure; 139 GiB usable here)


def drafter_parameters(cfg: DrafterConfig) -> int:
    """Trainable parameters of the drafter `cfg` describes, counted on a meta-device model."""
    with torch.device("meta"):
        table = torch.empty(cfg.n_vocab, cfg.n_embd)
        model = DFlash2Drafter(cfg, table, table)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@dataclass
class TrainPlan:
    info: TargetInfo
    cfg: DrafterConfig
    target_bytes: int  # the GGUF file
    n_draft: int
    batch_seqs: int
    anchors: int
    max_new: int
    n_seq: int
    queue_size: int

    @property
    def params(self) -> int:
        return drafter_parameters(self.cfg)

    @property
    def seq_rows(self) -> int:
        """Most rows a sequence has: the prompt is cut to 512 tokens, plus the continuation."""
        return 512 + self.max_new

    @property
    def feature_bytes_per_token(self) -> int:
        return len(self.cfg.target_layer_ids) * self.cfg.n_embd * FEATURE_BYTES

    def numbers(self) -> dict[str, float]:
        c, N = self.cfg, self.params
        H, V = c.n_embd, c.n_vocab
        train_state = 16 * N  # fp32 weights, gradients, AdamW's two moments
        tables = 4 * H * (V + self.n_draft) + 8 * (V + self.n_draft)  # f32 embedding + head rows, index maps
        # activations of one sequence (fp32 upper bound; autocast keeps many of them in bf16)
        r, lc, n_tl = self.anchors * c.block_size, self.seq_rows, len(c.target_layer_ids)
        per_layer = (4 * (r * (10 * H + 3 * c.n_ff) + lc * 6 * c.n_head_kv * c.head_dim)
                     + 4 * 2 * c.n_head * r * (lc + r))  # attention scores, materialised
        act_seq = 4 * lc * (n_tl * H + 2 * H) + c.n_layer * per_layer + 10 * r * self.n_draft + 8 * r * H
        kv = self.n_seq * self.seq_rows * self.info.n_layer * 2 * self.info.n_head_kv * self.info.head_dim * 2
        queue_bytes = self.queue_size * self.seq_rows * (self.feature_bytes_per_token + TOKEN_BYTES)
        fixed = train_state + tables
        return {
            "params": N, "train_state": train_state, "tables": tables, "act_per_seq": act_seq,
            "act_batch": act_seq * self.batch_seqs, "device_offline": fixed + act_seq * self.batch_seqs,
            "feature_per_token": self.feature_bytes_per_token,
            "disk_per_mtok": 1e6 * (self.feature_bytes_per_token + TOKEN_BYTES),
            "target": self.target_bytes, "target_kv": kv, "queue": queue_bytes,
            "device_online": fixed + act_seq * self.batch_seqs + self.target_bytes + kv,
            "h200_batch_offline": max(0, int((0.9 * H200_BYTES - fixed) // act_seq)),
            "h200_batch_online": max(0, int((0.9 * H200_BYTES - fixed - self.target_bytes - kv) // act_seq)),
        }

    def render(self) -> str:
        c, i, x = self.cfg, self.info, self.numbers()

        def g(b: float) -> str:
            return f"{b / GIB:,.2f} GiB"

        return "\n".join([
            f"target   {i.path.name}: {i.arch}, {i.n_layer} layers, H {i.n_embd}, {i.n_head}/{i.n_head_kv} heads x "
            f"{i.head_dim}, FFN {i.n_ff}, vocab {i.n_vocab:,}; file {g(self.target_bytes)}",
            f"drafter  {c.n_layer} layers, block {c.block_size}, {c.n_head}/{c.n_head_kv} heads x {c.head_dim}, "
            f"FFN {c.n_ff}, taps {list(c.target_layer_ids)}, draft vocab {self.n_draft:,}, "
            f"selector rank {c.selector_rank} top-k {c.selector_top_k}",
            f"parameters      {x['params']:,} trainable (exact)",
            f"training state  {g(x['train_state'])}: fp32 weights + gradients + AdamW moments (16 bytes/parameter)",
            f"frozen tables   {g(x['tables'])}: fp32 embedding [{c.n_vocab:,} x {c.n_embd}] + head rows "
            f"[{self.n_draft:,} x {c.n_embd}] on the training device",
            f"activations     ~{g(x['act_per_seq'])} per sequence ({self.anchors} anchors x block {c.block_size}, "
            f"{self.seq_rows} context rows; fp32 estimate), ~{g(x['act_batch'])} for --batch {self.batch_seqs}",
            f"features        {x['feature_per_token']:,} bytes per token ({len(c.target_layer_ids)} taps x "
            f"{c.n_embd} x f16); offline data: {g(x['disk_per_mtok'])} of disk per million tokens",
            f"offline device  ~{g(x['device_offline'])} (state + tables + activations)",
            f"online  device  ~{g(x['device_online'])}: + the target {g(x['target'])} + its KV cache "
            f"{g(x['target_kv'])} (--n-seq {self.n_seq} x {self.seq_rows} rows, f16) if it shares the device; "
            f"host queue {g(x['queue'])} ({self.queue_size} sequences)",
            f"one H200 (141 GB, 90% used): ~{x['h200_batch_offline']} sequences per step offline, "
            f"~{x['h200_batch_online']} online with the target on it",
        ])


def make_plan(info: TargetInfo, cfg: DrafterConfig, *, n_draft: int, batch_seqs: int, anchors: int, max_new: int,
              n_seq: int, queue_size: int, target_bytes: int | None = None) -> TrainPlan:
    size = target_bytes if target_bytes is not None else Path(info.path).stat().st_size
    return TrainPlan(info, cfg, size, n_draft or cfg.n_vocab, batch_seqs, anchors, max_new, n_seq, queue_size)
