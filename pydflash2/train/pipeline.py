"""`pydflash2 train` end to end: prompts -> self-distilled data -> trained drafter
-> DIR/hf (Hugging Face checkpoint) and DIR/drafter.gguf (through our converter).

DIR layout: data/ (the dataset), checkpoint.pt, train_log.jsonl, hf/,
drafter.gguf, summary.json. Every stage resumes: distillation skips prompts
already in data/, training continues from checkpoint.pt. After the export the
drafter is measured in the real engine on held-out prompts (evaluate.py):
summary.json["eval"].

Under torchrun rank 0 alone distils, exports, converts and evaluates; the other
ranks wait for it (parallel.Parallel.main_only) and train beside it. With
--online (one process) no data/ is written: online.py streams the target's
sequences into training.
"""

from __future__ import annotations

import dataclasses
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
    layers: int = 0  # drafter layers (0: from the target, default_shape)
    taps: int = 5  # target layers tapped (spread over the depth)
    block_size: int = 0  # 0: from the target, default_shape
    draft_vocab: int = 8192  # 0: the full vocabulary
    version: int = 2
    n_head: int = 0  # 0: the target's query heads
    n_head_kv: int = 0  # 0: the target's KV heads
    n_ff: int = 0  # 0: the target's FFN width
    selector_rank: int = 32
    selector_top_k: int = 16
    conv_kernel_size: int = 2
    conv_group_size: int = 64
    outtype: str = "q8_0"
    max_prompts: int = 0  # 0: all
    max_new: int = 128
    n_seq: int = 8
    data_minutes: float = 0.0  # 0: until every prompt is distilled
    threads: int = 0  # llama.cpp threads while distilling (0: distill.default_threads)
    n_gpu_layers: int = 0  # target layers on the GPU, in distillation and in the engine evaluation
    train_device: str = "auto"  # where the drafter trains (parallel.resolve_device)
    online: bool = False  # the target distils while the drafter trains; nothing is stored
    queue_size: int = 64  # online: finished sequences waiting for the trainer
    eval_prompts: int = 8  # held-out prompts the exported drafter is measured on in the engine (0: none)
    eval_max_tokens: int = 64
    eval_file: Path | None = None  # None: the built-in dev prompts
    device: str = "auto"  # where the drafter runs for that evaluation
    soft_top_k: int = 0  # distillation keeps the target's top-k log-probabilities (0: hard labels only)
    soft_weight: float | None = None  # None: 0.5 when the data keeps soft labels, else 0
    init_layers: str = "none"  # "none", "first", "last" or comma-separated target layer ids
    init_drafter: Path | None = None  # a trained dflash GGUF to start from (warm_start.py): shape and vocab kept
    resume: bool = False
    progress: bool | None = None
    settings: dict = field(default_factory=dict)  # TrainSettings overrides


# targets this wide get the published drafters' recipe (DFlash/SpecForge: 5 layers, block 16,
# decay gamma 7); narrower ones the recipe measured on SmolLM2 here (2 layers, block 8, gamma 4)
LARGE_TARGET_EMBD = 2048
ONLINE_VOCAB_SEQS = 64  # online: sequences the draft vocabulary is counted on before training
ONLINE_VAL_SEQS = 10  # online with the full vocabulary: the first sequences (one held out)


def log(msg: str) -> None:
    print(f"[pydflash2 train] {msg}", file=sys.stderr, flush=True)


def default_shape(info) -> tuple[int, int, float]:  # noqa: ANN001
    """(layers, block size, gamma) for a target."""
    return (5, 16, 7.0) if info.n_embd >= LARGE_TARGET_EMBD else (2, 8, 4.0)


def init_layer_ids(spec: str, n_layers: int, n_target_layers: int) -> list[int]:
    """Target layer ids the drafter's n_layers layers start from ([] for random init)."""
    if spec == "none":
        return []
    if spec == "first":
        return list(range(min(n_layers, n_target_layers)))
    if spec == "last":
        return list(range(max(0, n_target_layers - n_layers), n_target_layers))
    return [int(x) for x in spec.split(",")]


def make_config(opts: TrainOptions, info, target_layer_ids: list[int], draft_ids: list[int]):  # noqa: ANN001, ANN201
    """The drafter's shape: the target's attention (query/KV heads, head dim) and FFN width
    unless overridden, so warm starts and published recipes apply."""
    from .model import DrafterConfig
    from .target import target_shape

    H = info.n_embd
    layers, block, _ = default_shape(info)
    n_head = opts.n_head or info.n_head
    n_head_kv = opts.n_head_kv or (info.n_head_kv if not opts.n_head or opts.n_head % info.n_head_kv == 0 else n_head)
    if n_head % n_head_kv:
        raise ValueError(f"--n-head {n_head} must be a multiple of --n-head-kv {n_head_kv}")
    head_dim, n_ff = info.head_dim, opts.n_ff or info.n_ff or max(64, int(round(H * 8 / 3 / 64)) * 64)
    if opts.init_layers != "none":  # copied layers keep the target's shape, whatever the overrides
        shape = target_shape(opts.target)
        n_head, n_head_kv, head_dim, n_ff = shape["n_head"], shape["n_head_kv"], shape["head_dim"], shape["n_ff"]
    k = opts.selector_top_k
    while k > 1 and k * (k + 1) > H:  # upstream packs the lattice into H-wide rows
        k -= 1
    group = opts.conv_group_size if H % opts.conv_group_size == 0 else H
    return DrafterConfig(
        n_embd=H, n_vocab=info.n_vocab, target_layer_ids=list(target_layer_ids),
        mask_token_id=info.mask_token_id, n_layer=opts.layers or layers, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_ff=n_ff,
        block_size=opts.block_size or block, rms_eps=info.rms_eps, rope_theta=info.rope_theta, version=opts.version,
        conv_kernel_size=opts.conv_kernel_size, conv_group_size=group, selector_rank=opts.selector_rank,
        selector_top_k=k, draft_ids=draft_ids,
    )


def start_config(opts: TrainOptions, info):  # noqa: ANN001, ANN201
    """The config of --init-drafter's file (None without one)."""
    if opts.init_drafter is None:
        return None
    from .warm_start import drafter_config

    return drafter_config(opts.init_drafter, n_embd=info.n_embd, n_vocab=info.n_vocab)


def settings_for(opts: TrainOptions, info):  # noqa: ANN001, ANN201
    from .trainer import TrainSettings

    st = dict(opts.settings)
    if st.get("gamma") is None:
        st["gamma"] = default_shape(info)[2] if not opts.block_size else (7.0 if opts.block_size >= 16 else 4.0)
    return TrainSettings(**st)


def dry_run(opts: TrainOptions) -> str:
    """The plan of this run (plan.py), for any GGUF target, without training."""
    from .plan import make_plan
    from .target import read_target, tap_layers
    from .trainer import TrainSettings

    info = read_target(opts.target)
    warm = start_config(opts, info)
    cfg = warm or make_config(opts, info, tap_layers(info.n_layer, opts.taps), [])
    s = TrainSettings(**{k: v for k, v in opts.settings.items() if v is not None})
    n_draft = warm.n_draft if warm else opts.draft_vocab if 0 < opts.draft_vocab < info.n_vocab else info.n_vocab
    return make_plan(info, cfg, n_draft=n_draft, batch_seqs=s.batch_seqs, anchors=s.anchors, max_new=opts.max_new,
                     n_seq=opts.n_seq, queue_size=opts.queue_size).render()


def run(opts: TrainOptions) -> dict:
    from contextlib import ExitStack

    from .parallel import setup

    par = setup(opts.train_device)
    with ExitStack() as cleanup:  # the process group, and on errors the online producer
        cleanup.callback(par.close)
        return _run(opts, par, cleanup)


def _run(opts: TrainOptions, par, cleanup) -> dict:  # noqa: ANN001
    import torch

    from .dataset import Dataset
    from .distill import distill
    from .model import DrafterConfig
    from .target import read_target, tap_layers
    from .trainer import CHECKPOINT, anchor_seed, build_model, train
    from .vocab import coverage, draft_vocabulary

    out = opts.out
    ckpt = out / CHECKPOINT
    if opts.online and par.distributed:
        raise ValueError("--online runs in one process: under torchrun, distil first (offline) and train on data/")

    def prepare() -> None:
        if out.exists() and any(out.iterdir()) and not opts.resume:
            raise FileExistsError(f"{out} is not empty: pass --resume to continue that run, or choose a new --out")
        out.mkdir(parents=True, exist_ok=True)

    info = read_target(opts.target)
    warm = start_config(opts, info)  # a wrong --init-drafter fails before DIR is touched
    if warm is not None:  # the loss's decay follows the file's block size
        opts = dataclasses.replace(opts, block_size=warm.block_size)
    par.main_only(prepare)
    taps = warm.target_layer_ids if warm is not None else tap_layers(info.n_layer, opts.taps)
    prompts = read_prompts(opts.prompts)
    if opts.max_prompts:
        prompts = prompts[: opts.max_prompts]
    if not prompts:
        raise ValueError(f"{opts.prompts} holds no prompt")
    from ..capture import capture_path

    if par.is_main:
        log(f"target {opts.target.name}: {info.arch}, {info.n_layer} layers, H={info.n_embd}, vocab {info.n_vocab}; "
            f"taps (HF ids) {taps} through the {capture_path(info.arch)} capture path; "
            f"MASK = {info.mask_token!r} (id {info.mask_token_id}); training on {par.device}"
            + (f", {par.world} ranks" if par.distributed else ""))
    settings = settings_for(opts, info)
    st = torch.load(ckpt, map_location="cpu", weights_only=False) if ckpt.exists() else None

    t0 = time.monotonic()
    data_dir = out / "data"
    stream = None
    if opts.online:
        from .online import OnlineStream

        # the first sequences: the draft vocabulary is counted on them, a tenth is held out
        n_head = ONLINE_VOCAB_SEQS if 0 < opts.draft_vocab < info.n_vocab else ONLINE_VAL_SEQS
        start = (n_head + st["step"] * settings.batch_seqs) if st else 0  # resumed: further on in the prompts
        stream = cleanup.enter_context(OnlineStream(
            opts.target, prompts, taps, info.n_embd, n_seq=opts.n_seq, max_new=opts.max_new,
            n_threads=opts.threads or None, n_gpu_layers=opts.n_gpu_layers, queue_size=opts.queue_size, start=start,
            top_k=opts.soft_top_k))
        data = stream.take(n_head)
        n_val = min(settings.val_seqs, len(data) // 10)
        val_ids = data.ids[:n_val]
        stream.give_back(data, n_val)  # the others are the first to train on
    else:
        if st is None:
            deadline = time.monotonic() + opts.data_minutes * 60 if opts.data_minutes > 0 else None
            par.main_only(lambda: distill(opts.target, prompts, data_dir, taps, n_seq=opts.n_seq, max_new=opts.max_new,
                                          n_threads=opts.threads or None, progress=opts.progress, deadline=deadline,
                                          n_gpu_layers=opts.n_gpu_layers, top_k=opts.soft_top_k))
        data = Dataset(data_dir)  # after a checkpoint: the data training started on, as it is
    if len(data) == 0:
        raise ValueError("distillation produced no sequence")
    data_s = time.monotonic() - t0
    if par.is_main:
        log(f"data: {len(data)} sequences, {data.completion_tokens()} target tokens"
            + (" (online: the first ones, for the draft vocabulary and the held-out set)" if opts.online else
               f", {(data_dir / 'features.bin').stat().st_size / 2**20:.0f} MiB of features") + f" ({data_s:.0f} s)")

    def configure() -> DrafterConfig:
        if st is not None:
            return DrafterConfig(**st["config"])
        if warm is not None:
            log(f"drafter from {opts.init_drafter}: its shape, taps and draft vocabulary "
                f"({warm.n_draft} tokens, {100 * coverage(data.token_counts(info.n_vocab), warm.draft_ids):.2f}% "
                "of this data's tokens)")
            return warm
        counts = data.token_counts(info.n_vocab)
        draft_ids = draft_vocabulary(counts, opts.draft_vocab, always=[info.eos_token_id])
        if draft_ids:
            log(f"draft vocabulary: {len(draft_ids)} tokens cover {100 * coverage(counts, draft_ids):.2f}% "
                "of the target's tokens" + (" (in the first sequences)" if opts.online else ""))
        return make_config(opts, info, taps, draft_ids)

    cfg = par.main_only(configure)
    init = [] if st is not None else init_layer_ids(opts.init_layers, cfg.n_layer, info.n_layer)
    torch.manual_seed(settings.seed)  # the same initial drafter on every rank and in every rerun
    model = build_model(cfg, opts.target, par.device, init_layers=init)
    if warm is not None and st is None:
        from .warm_start import load_weights

        load_weights(model, opts.init_drafter)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if par.is_main:
        log(f"drafter: DFlash{'2' if cfg.version == 2 else ''}, {cfg.n_layer} layer(s), {cfg.n_head}/{cfg.n_head_kv} "
            f"heads x {cfg.head_dim}, FFN {cfg.n_ff}, {n_params:,} trainable parameters, block {cfg.block_size}")
        if init:
            log(f"drafter layers start as target layers {init}")
    soft_weight = opts.soft_weight if opts.soft_weight is not None else (0.5 if data.top_k else 0.0)
    if soft_weight > 0 and not data.top_k:
        raise ValueError(f"--soft-weight {soft_weight} needs soft labels: the data was distilled without --soft-top-k")
    settings = dataclasses.replace(settings, soft_weight=soft_weight)
    t1 = time.monotonic()
    if stream is not None:
        from .online import online_batches

        batches = online_batches(stream, settings.batch_seqs, settings.anchors, cfg.block_size,
                                 lambda step: anchor_seed(settings.seed, step))
        summary = train(model, data, out, settings, par=par, resume=opts.resume, progress=opts.progress,
                        batches=batches, val_ids=val_ids)
        stream.close()  # before the export and the evaluation: the target's context goes
        summary["online_sequences"] = stream.taken - n_val
        summary["online_target_tokens"] = stream.completion_tokens
    else:
        summary = train(model, data, out, settings, par=par, resume=opts.resume, progress=opts.progress)
    train_s = time.monotonic() - t1
    if par.device.type == "cuda":
        summary["peak_device_mib"] = round(torch.cuda.max_memory_allocated(par.device) / 2**20, 1)
    summary["trainable_parameters"] = n_params
    result = par.main_only(lambda: _finish(opts, info, cfg, model, data, summary, data_s, train_s, init, settings))
    return result


def _finish(opts: TrainOptions, info, cfg, model, data, summary: dict, data_s: float, train_s: float,  # noqa: ANN001
            init: list[int], settings) -> dict:  # noqa: ANN001
    """Rank 0: export, conversion, the engine evaluation, summary.json."""
    from .export import export_gguf, export_hf

    out = opts.out
    hf = export_hf(model, out / "hf")
    gguf_path = export_gguf(hf, opts.target, out / "drafter.gguf", opts.outtype)
    features = out / "data" / "features.bin"
    summary.update({
        "target": str(opts.target), "sequences": summary.get("online_sequences", len(data)),
        "target_tokens": summary.get("online_target_tokens", data.completion_tokens()),
        "feature_mib": round(features.stat().st_size / 2**20, 1) if features.exists() else 0.0,
        "online": opts.online, "data_seconds": round(data_s, 1), "train_wall_seconds": round(train_s, 1),
        "train_device": str(model.embed.device),
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
                                  max_tokens=opts.eval_max_tokens, device=opts.device, n_threads=opts.threads or None,
                                  n_gpu_layers=opts.n_gpu_layers)
        summary["eval"] = {k: v for k, v in result.items() if k != "tokens"}
        summary["eval"]["seconds"] = round(time.monotonic() - t2, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        log(describe(result))
    return summary
