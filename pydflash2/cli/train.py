"""`pydflash2 train`: a DFlash2 drafter for any GGUF target (needs pydflash2[train])."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import CliError, add_device_args, setup_devices

NAME = "train"

EPILOG = """\
Data comes from the target itself: every prompt goes through its chat template
and the target's greedy continuation (--max-new tokens) is recorded together
with the target's layer-input features at the tapped layers (DIR/data/, f16,
memory-mapped). The drafter then learns to predict those continuations a
block at a time. DIR ends up with hf/ (Hugging Face DFlash2 checkpoint),
drafter.gguf (through pydflash2 convert), checkpoint.pt, train_log.jsonl and
summary.json. Interrupted runs continue with --resume (same DIR).
Finally the exported drafter runs in pydflash2's engine on --eval-prompts
held-out prompts (greedy, its whole block drafted every step; --device places
it): tau and the acceptance at each block position go to the log and to
summary.json["eval"].
--train-device places the drafter's training (auto: CUDA, else MPS, else the
CPU; bf16 autocast on CUDA); -ngl offloads the target's layers while it
distils and in the engine evaluation. --online: the target distils while the
drafter trains, nothing is stored (one process). --dry-run prints the plan
(parameters, memory, disk) for any target without training.
Several processes/GPUs: torchrun --nproc-per-node N -m pydflash2 train ...
(DistributedDataParallel: gloo on the CPU, nccl on CUDA; --batch is the global
batch; rank 0 distils, exports and evaluates).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="train a DFlash2 drafter for a target GGUF (needs pydflash2[train])",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target GGUF (or smollm2 for the default target)")
    p.add_argument("--out", required=True, help="output folder DIR")
    p.add_argument("--prompts", help="one prompt per line (default: the 2,000+ built-in training prompts)")
    p.add_argument("--layers", type=int, default=0,
                   help="drafter layers (default: 5 for targets with H >= 2048, as published drafters; else 2)")
    p.add_argument("--taps", type=int, default=None, help="target layers whose features the drafter reads (default 5)")
    p.add_argument("--block-size", type=int, default=0,
                   help="block size: anchor + up to B-1 drafts (default: 16 for targets with H >= 2048; else 8)")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="reduced draft vocabulary: the V most frequent target tokens (default 8192; 0: full)")
    p.add_argument("--max-minutes", type=float, default=30.0, help="training time budget (default 30)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (default: time only)")
    p.add_argument("--data-minutes", type=float, default=0.0,
                   help="stop distilling after this long and train on what is there (default: all prompts)")
    p.add_argument("--max-prompts", type=int, default=0, help="use only the first N prompts")
    p.add_argument("--max-new", type=int, default=128, help="continuation tokens per prompt (default 128)")
    p.add_argument("--n-seq", type=int, default=8, help="sequences per target decode (default 8)")
    p.add_argument("--version", type=int, choices=[1, 2], default=None, help="2: DFlash2 (default), 1: DFlash")
    p.add_argument("--rank", type=int, default=None, help="selector rank (default 32)")
    p.add_argument("--top-k", type=int, default=None, help="selector candidates per position (default 16)")
    p.add_argument("--n-head", type=int, default=0, help="drafter query heads (default: the target's)")
    p.add_argument("--n-head-kv", type=int, default=0, help="drafter KV heads (default: the target's)")
    p.add_argument("--ffn", type=int, default=0, help="drafter FFN width (default: the target's)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--anchors", type=int, default=24, help="anchors per sequence (default 24)")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--gamma", type=float, default=None,
                   help="loss decay over block positions (0: none; default 7 for block 16 and up, else 4)")
    p.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="q8_0",
                   help="GGUF weight type (default q8_0)")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=0,
                   help="threads for llama.cpp and torch (default: theirs; on a busy machine 1 can be much faster)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the run in DIR")
    p.add_argument("--train-device", default="auto",
                   help="torch device for training: auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N, mps")
    p.add_argument("--online", action="store_true",
                   help="distil while training: the target's sequences go straight to the trainer, none to disk")
    p.add_argument("--queue-size", type=int, default=64, help="--online: finished sequences held for the trainer")
    p.add_argument("--dry-run", action="store_true",
                   help="print the drafter's shape, parameters, memory and disk for this target; train nothing")
    p.add_argument("--eval-prompts", type=int, default=8,
                   help="held-out prompts to measure the exported drafter on in the engine (default 8; 0: skip)")
    p.add_argument("--eval-max-tokens", type=int, default=64, help="tokens per evaluation prompt (default 64)")
    p.add_argument("--soft-top-k", type=int, default=0,
                   help="keep the target's top-K next-token log-probabilities while distilling (soft labels; "
                        "0: none, 32-64 recommended)")
    p.add_argument("--soft-weight", type=float, default=None,
                   help="share of the KL to those soft labels in the token loss, the rest hard cross-entropy "
                        "(default 0.5 when the data has soft labels, else 0)")
    p.add_argument("--init-layers", default="none",
                   help="drafter layers start as these target layers: comma list of target layer ids, 'first' "
                        "/ 'last' (the target's first / last --layers layers) or 'none' (random; default). Takes "
                        "the target's attention and MLP shape")
    p.add_argument("--init-drafter", metavar="GGUF",
                   help="start from this trained dflash drafter (made for this target) and train it further on "
                        "--prompts: its shape, taps, selector and draft vocabulary are kept")
    p.add_argument("--selector-decay", action="store_true",
                   help="decay-weight the selector loss over block positions like the token loss")
    p.add_argument("--selector-backbone", action="store_true",
                   help="let the selector loss train the drafter layers too (default: detached)")
    p.add_argument("--no-selector-gold-slot", action="store_true",
                   help="drop positions whose gold token is not a candidate from the selector loss "
                        "(default: the gold token takes the last candidate slot)")
    p.add_argument("--eval-file", help="prompts for that evaluation, one per line (default: the built-in dev prompts)")
    add_device_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CliError("training needs PyTorch: pip install 'pydflash2[train]'") from None
    from ..models import resolve_target
    from ..train.pipeline import TrainOptions
    from ..train.pipeline import run as run_pipeline
    from ..train.prompts import TRAIN_FILE

    target = resolve_target(args.target) if args.target == "smollm2" else Path(args.target)
    if not target.is_file():
        raise CliError(f"target model not found: {target}")
    prompts = Path(args.prompts) if args.prompts else TRAIN_FILE
    if not prompts.is_file():
        raise CliError(f"--prompts: {prompts} not found")
    shape_options = {"taps": 5, "rank": 32, "top_k": 16, "draft_vocab": 8192, "version": 2}
    init_drafter = Path(args.init_drafter) if args.init_drafter else None
    if init_drafter is not None:
        if not init_drafter.is_file():
            raise CliError(f"--init-drafter: {init_drafter} not found")
        given = [n for n in shape_options if getattr(args, n) is not None]
        given += [n for n in ("layers", "block_size", "n_head", "n_head_kv", "ffn") if getattr(args, n)]
        if args.init_layers != "none":
            given.append("init_layers")
        if given:
            raise CliError("--init-drafter keeps the drafter's own shape, taps, selector and vocabulary: drop "
                           + ", ".join("--" + n.replace("_", "-") for n in given))
    for name, default in shape_options.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("taps", "rank", "top_k", "batch", "anchors", "eval_max_tokens", "queue_size"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("layers", "n_head", "n_head_kv", "ffn"):  # 0: from the target
        if getattr(args, name) < 0:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1 (or 0: from the target)")
    if args.block_size == 1 or args.block_size < 0:
        raise CliError("--block-size must be >= 2")
    try:
        from ..train.parallel import resolve_device

        if not args.dry_run:
            resolve_device(args.train_device)  # an unusable --train-device fails now, not after distillation
    except ValueError as e:
        raise CliError(str(e)) from None
    if args.eval_prompts < 0:
        raise CliError("--eval-prompts must be >= 0")
    eval_file = Path(args.eval_file) if args.eval_file else None
    if eval_file is not None and not eval_file.is_file():
        raise CliError(f"--eval-file: {eval_file} not found")
    if args.soft_top_k < 0 or (args.soft_weight is not None and not 0.0 <= args.soft_weight <= 1.0):
        raise CliError("--soft-top-k must be >= 0 and --soft-weight in [0, 1]")
    if args.init_layers not in ("none", "first", "last"):
        try:
            [int(x) for x in args.init_layers.split(",")]
        except ValueError:
            raise CliError(f"--init-layers: {args.init_layers!r} is not 'none', 'first', 'last' or a comma list "
                           "of target layer ids") from None
    if args.eval_prompts > 0 or args.n_gpu_layers:
        setup_devices(args)  # an unknown --device fails now, not after training; RPC servers before the target
    opts = TrainOptions(
        target=target, out=Path(args.out), prompts=prompts, layers=args.layers, taps=args.taps,
        block_size=args.block_size, draft_vocab=args.draft_vocab, version=args.version, n_ff=args.ffn,
        n_head=args.n_head, n_head_kv=args.n_head_kv, n_gpu_layers=args.n_gpu_layers,
        train_device=args.train_device, online=args.online, queue_size=args.queue_size,
        selector_rank=args.rank, selector_top_k=args.top_k, outtype=args.outtype, max_prompts=args.max_prompts,
        max_new=args.max_new, n_seq=args.n_seq, data_minutes=args.data_minutes, resume=args.resume,
        threads=args.threads, eval_prompts=args.eval_prompts, eval_max_tokens=args.eval_max_tokens,
        eval_file=eval_file, device=args.device, soft_top_k=args.soft_top_k, init_layers=args.init_layers,
        init_drafter=init_drafter,
        soft_weight=args.soft_weight,
        settings={"max_minutes": args.max_minutes, "max_steps": args.max_steps, "batch_seqs": args.batch,
                  "anchors": args.anchors, "lr": args.lr, "gamma": args.gamma,
                  "checkpoint_minutes": args.checkpoint_minutes, "seed": args.seed, "threads": args.threads,
                  "selector_decay": args.selector_decay, "selector_backbone": args.selector_backbone,
                  "selector_gold_slot": not args.no_selector_gold_slot},
    )
    try:
        if args.dry_run:
            from ..train.pipeline import dry_run

            print(dry_run(opts))
            return 0
        run_pipeline(opts)
    except (FileExistsError, ValueError) as e:
        raise CliError(str(e)) from None
    return 0
