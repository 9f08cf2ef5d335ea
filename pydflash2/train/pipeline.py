"""`pydflash2 train` end to end: prompts -> self-distilled data -> trained drafter
-> DIR/hf (Hugging Face checkpoint) and DIR/drafter.gguf (through our converter).

DIR layout: data/ (the dataset), checkpoint.pt, train_log.jsonl, hf/,
drafter.gguf, summary.json. Every stage resumes: distillation skips prompts
already in data/, training continues from checkpoint.pt. After the export the
drafter is measured in the real engine on held-out prompts (evaluate.py):
summary.json["eval"].
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .prompts import TRAIN_FILE, read_prompts


@dataclass
class TrainOptions:
    target: Path
    out: Path
    prompts: Path = TRAIN_FILE
    layers: int = 1  # drafter layers
    taps: int = 5  # target layers tapped (spread over the depth)
    block_size: int = 8
    draft_vocab: int = 8192  # 0: the full vocabulary
    version: int = 2
    n_head: int = 0  # 0: hidden_size // 64
    n_head_kv: int = 0  # 0: n_head // 3 if divisible, else n_head
    n_ff: int = 0  # 0: the target's hidden size * 8/3, rounded to 64
    selector_rank: int = 32
    selector_top_k: int = 16
    conv_kernel_size: int = 2
    conv_group_size: int = 64
    outtype: str = "q8_0"
    max_prompts: int = 0  # 0: all
    max_new: int = 128
    n_seq: int = 8
    data_minutes: float = 0.0  # 0: until every prompt is distilled
    threads: int = 0  # llama.cpp threads while distilling (0: its default)
    eval_prompts: int = 8  # held-out prompts the exported drafter is measured on in the engine (0: none)
    eval_max_tokens: int = 64
    eval_file: Path | None = None  # None: the built-in dev prompts
    device: str = "auto"  # where the drafter runs for that evaluation
    soft_top_k: int = 0  # distillation keeps the target's top-k log-probabilities (0: hard labels only)
    soft_weight: float | None = None  # None: 0.5 when the data keeps soft labels, else 0
    init_layers: str = "none"  # "none", "first", "last" or comma-separated target layer ids
    resume: bool = False
    progress: bool | None = None
    settings: dict = field(default_factory=dict)  # TrainSettings overrides


def log(msg: str) -> None:
    print(f"[pydflash2 train] {msg}", file=sys.stderr, flush=True)


def init_layer_ids(opts: TrainOptions, n_target_layers: int) -> list[int]:
    """Target layer ids the drafter layers start from ([] for random init)."""
    if opts.init_layers == "none":
        return []
    if opts.init_layers == "first":
        return list(range(min(opts.layers, n_target_layers)))
    if opts.init_layers == "last":
        return list(range(max(0, n_target_layers - opts.layers), n_target_layers))
    return [int(x) for x in opts.init_layers.split(",")]


def make_config(opts: TrainOptions, info, data, draft_ids: list[int]):  # noqa: ANN001, ANN201
    from .model import DrafterConfig
    from .target import target_shape

    H = info.n_embd
    n_head = opts.n_head or max(1, H // 64)
    n_head_kv = opts.n_head_kv or (n_head // 3 if n_head % 3 == 0 else n_head)
    head_dim, n_ff = H // n_head, opts.n_ff or max(64, int(round(H * 8 / 3 / 64)) * 64)
    if opts.init_layers != "none":  # copied layers keep the target's shape
        shape = target_shape(opts.target)
        n_head, n_head_kv, head_dim, n_ff = shape["n_head"], shape["n_head_kv"], shape["head_dim"], shape["n_ff"]
    k = opts.selector_top_k
    while k > 1 and k * (k + 1) > H:  # upstream packs the lattice into H-wide rows
        k -= 1
    group = opts.conv_group_size if H % opts.conv_group_size == 0 else H
    return DrafterConfig(
        n_embd=H, n_vocab=info.n_vocab, target_layer_ids=list(data.meta["target_layer_ids"]),
        mask_token_id=info.mask_token_id, n_layer=opts.layers, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_ff=n_ff,
        block_size=opts.block_size, rms_eps=info.rms_eps, rope_theta=info.rope_theta, version=opts.version,
        conv_kernel_size=opts.conv_kernel_size, conv_group_size=group, selector_rank=opts.selector_rank,
        selector_top_k=k, draft_ids=draft_ids,
    )


def run(opts: TrainOptions) -> dict:
    import torch

    from .dataset import Dataset
    from .distill import distill
    from .export import export_gguf, export_hf
    from .model import DrafterConfig
    from .target import read_target, tap_layers
    from .trainer import CHECKPOINT, TrainSettings, build_model, train
    from .vocab import coverage, draft_vocabulary

    out = opts.out
    ckpt = out / CHECKPOINT
    if out.exists() and any(out.iterdir()) and not opts.resume:
        raise FileExistsError(f"{out} is not empty: pass --resume to continue that run, or choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    info = read_target(opts.target)
    taps = tap_layers(info.n_layer, opts.taps)
    prompts = read_prompts(opts.prompts)
    if opts.max_prompts:
        prompts = prompts[: opts.max_prompts]
    if not prompts:
        raise ValueError(f"{opts.prompts} holds no prompt")
    from ..capture import capture_path

    log(f"target {opts.target.name}: {info.arch}, {info.n_layer} layers, H={info.n_embd}, vocab {info.n_vocab}; "
        f"taps (HF ids) {taps} through the {capture_path(info.arch)} capture path; "
        f"MASK = {info.mask_token!r} (id {info.mask_token_id})")

    t0 = time.monotonic()
    data_dir = out / "data"
    if ckpt.exists():
        data = Dataset(data_dir)  # training already started on this data: keep it as it is
    else:
        deadline = time.monotonic() + opts.data_minutes * 60 if opts.data_minutes > 0 else None
        distill(opts.target, prompts, data_dir, taps, n_seq=opts.n_seq, max_new=opts.max_new,
                n_threads=opts.threads or None, progress=opts.progress, deadline=deadline, top_k=opts.soft_top_k)
        data = Dataset(data_dir)
    if len(data) == 0:
        raise ValueError("distillation produced no sequence")
    data_s = time.monotonic() - t0
    log(f"data: {len(data)} sequences, {data.n_rows} rows, {data.completion_tokens()} target tokens, "
        f"{(data_dir / 'features.bin').stat().st_size / 2**20:.0f} MiB of features ({data_s:.0f} s)")

    if ckpt.exists():
        cfg = DrafterConfig(**torch.load(ckpt, map_location="cpu", weights_only=False)["config"])
    else:
        counts = data.token_counts(info.n_vocab)
        draft_ids = draft_vocabulary(counts, opts.draft_vocab, always=[info.eos_token_id])
        cfg = make_config(opts, info, data, draft_ids)
        if draft_ids:
            log(f"draft vocabulary: {len(draft_ids)} tokens cover {100 * coverage(counts, draft_ids):.2f}% "
                "of the target's tokens")
    init = [] if ckpt.exists() else init_layer_ids(opts, info.n_layer)
    model = build_model(cfg, opts.target, init)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"drafter: DFlash{'2' if cfg.version == 2 else ''}, {cfg.n_layer} layer(s), {n_params / 1e6:.2f} M "
        f"trainable parameters, block {cfg.block_size}")
    soft_weight = opts.soft_weight if opts.soft_weight is not None else (0.5 if data.top_k else 0.0)
    if soft_weight > 0 and not data.top_k:
        raise ValueError(f"--soft-weight {soft_weight} needs soft labels: {data_dir} was distilled "
                         "without --soft-top-k")
    settings = TrainSettings(**{"soft_weight": soft_weight, **opts.settings})
    if init:
        log(f"drafter layers start as target layers {init}")
    t1 = time.monotonic()
    summary = train(model, data, out, settings, resume=opts.resume, progress=opts.progress)
    hf = export_hf(model, out / "hf")
    gguf_path = export_gguf(hf, opts.target, out / "drafter.gguf", opts.outtype)
    summary.update({
        "target": str(opts.target), "sequences": len(data), "target_tokens": data.completion_tokens(),
        "feature_mib": round((data_dir / "features.bin").stat().st_size / 2**20, 1),
        "data_seconds": round(data_s, 1), "train_wall_seconds": round(time.monotonic() - t1, 1),
        "gguf": str(gguf_path), "gguf_mib": round(gguf_path.stat().st_size / 2**20, 2),
        "config": {k: v for k, v in cfg.to_dict().items() if k != "draft_ids"}, "draft_vocab": cfg.n_draft,
        "mask_token": info.mask_token, "init_layers": init, "soft_top_k": data.top_k,
        "loss": {k: getattr(settings, k) for k in ("soft_weight", "gamma", "selector_gold_slot", "selector_decay",
                                                   "selector_backbone")},
    })
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"wrote {hf} and {gguf_path} ({summary['gguf_mib']} MiB); "
        f"val ce {summary.get('val_ce', float('nan')):.3f}, est. tau {summary.get('val_tau_est', float('nan')):.2f}")
    if opts.eval_prompts > 0:
        from .evaluate import describe, eval_prompts, evaluate_drafter
        from .prompts import DEV_FILE

        t2 = time.monotonic()
        result = evaluate_drafter(opts.target, gguf_path, eval_prompts(opts.eval_file or DEV_FILE, opts.eval_prompts),
                                  max_tokens=opts.eval_max_tokens, device=opts.device, n_threads=opts.threads or None)
        summary["eval"] = {k: v for k, v in result.items() if k != "tokens"}
        summary["eval"]["seconds"] = round(time.monotonic() - t2, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        log(describe(result))
    return summary
