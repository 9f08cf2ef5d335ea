"""Training-recipe ablations at equal compute on one shared distilled dataset.

`train`: one variant (labels, init, selector loss, prompt source) for a fixed number of steps on
the shared data (same draft vocabulary, same seed, same batches' sizes), exported to
OUT/drafter.gguf; its CPU seconds (process time, so other load on the machine does not count)
go to OUT/summary.json. `eval`: drafters side by side in the engine, greedy, their whole block
drafted every step, on prompt files (tau and acceptance per block position), one JSON line each.

    python benchmarks/recipe_ablation.py train --data D/data --prompts D/prompts.txt --out runs/soft \\
        --steps 300 --soft-weight 0.5 --init-layers last --threads 1
    python benchmarks/recipe_ablation.py eval --drafts runs/*/drafter.gguf \\
        --prompt-files benchmarks/prompts_chat_eval.txt pydflash2/data/prompts_dev.txt --n 32 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pydflash2.models import resolve_target


def train_variant(a: argparse.Namespace) -> None:
    import torch

    from pydflash2.train.dataset import Dataset
    from pydflash2.train.export import export_gguf, export_hf
    from pydflash2.train.pipeline import TrainOptions, init_layer_ids, make_config
    from pydflash2.train.target import read_target
    from pydflash2.train.trainer import TrainSettings, build_model, train
    from pydflash2.train.vocab import draft_vocabulary

    target = resolve_target(a.target) if a.target == "smollm2" else Path(a.target)
    info = read_target(target)
    data = Dataset(a.data)
    counts = data.token_counts(info.n_vocab)  # the whole shared data's vocabulary, whatever the subset
    if a.source != "all":
        sources = json.loads(Path(a.sources).read_text())  # {prompt index: source}, from sources.py
        data = data.subset({int(i) for i, s in sources.items() if s in a.source.split(",")})
    opts = TrainOptions(target=target, out=Path(a.out), layers=a.layers, init_layers=a.init_layers,
                        draft_vocab=a.draft_vocab)
    cfg = make_config(opts, info, data, draft_vocabulary(counts, a.draft_vocab, always=[info.eos_token_id]))
    torch.manual_seed(a.seed)
    model = build_model(cfg, target, init_layer_ids(opts, info.n_layer))
    s = TrainSettings(max_minutes=1e9, max_steps=a.steps, threads=a.threads, seed=a.seed, lr=a.lr,
                      soft_weight=a.soft_weight, selector_gold_slot=not a.old_selector,
                      selector_decay=a.old_selector, checkpoint_minutes=a.checkpoint_minutes,
                      selector_backbone=a.selector_backbone)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cpu0 = time.process_time()
    summary = train(model, data, out, s, resume=a.resume, progress=False)
    summary["cpu_seconds"] = round(time.process_time() - cpu0, 1)
    gguf = export_gguf(export_hf(model, out / "hf"), target, out / "drafter.gguf", "q8_0")
    summary.update({"variant": vars(a) | {"func": None}, "sequences": len(data), "gguf": str(gguf)})
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: summary[k] for k in ("steps", "cpu_seconds", "val_ce", "val_tau_est", "sequences")}))


def reexport(a: argparse.Namespace) -> None:
    """A trained run exported again with another draft vocabulary (the head rows are the target's,
    frozen, so any V works): RUN/drafter_V.gguf."""
    import torch

    from pydflash2.train.dataset import Dataset
    from pydflash2.train.export import export_gguf, export_hf
    from pydflash2.train.model import DrafterConfig
    from pydflash2.train.target import read_target
    from pydflash2.train.trainer import CHECKPOINT, build_model
    from pydflash2.train.vocab import draft_vocabulary

    target = resolve_target(a.target) if a.target == "smollm2" else Path(a.target)
    info = read_target(target)
    st = torch.load(Path(a.run) / CHECKPOINT, map_location="cpu", weights_only=False)
    model = build_model(DrafterConfig(**st["config"]), target)
    model.load_state_dict(st["model"])
    ids = draft_vocabulary(Dataset(a.data).token_counts(info.n_vocab), a.draft_vocab, always=[info.eos_token_id])
    hf = export_hf(model, Path(a.run) / f"hf_{a.draft_vocab}", draft_ids=ids)
    print(export_gguf(hf, target, Path(a.run) / f"drafter_{a.draft_vocab}.gguf", "q8_0"))


def step_speed(a: argparse.Namespace) -> None:
    """CPU seconds per training step, eager against torch.compile (same batches, after warm-up)."""
    import numpy as np
    import torch

    from pydflash2.train.dataset import Dataset
    from pydflash2.train.objective import LossOptions, compute_losses, sample_batch
    from pydflash2.train.pipeline import TrainOptions, make_config
    from pydflash2.train.target import read_target
    from pydflash2.train.trainer import build_model
    from pydflash2.train.vocab import draft_vocabulary

    torch.set_num_threads(a.threads)
    target = resolve_target(a.target) if a.target == "smollm2" else Path(a.target)
    info = read_target(target)
    data = Dataset(a.data)
    rng = np.random.default_rng(0)
    batches = [sample_batch(data, rng, 8, 24, 8) for _ in range(a.warmup + a.steps)]
    for vocab in a.draft_vocabs:
        ids = draft_vocabulary(data.token_counts(info.n_vocab), vocab, always=[info.eos_token_id])
        for mode in a.modes:
            torch.manual_seed(0)
            model = build_model(make_config(TrainOptions(target=target, out=Path("."), layers=a.layers), info, data,
                                            ids), target)
            fwd = torch.compile(model, dynamic=True) if mode == "compile" else model
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            opts = LossOptions(soft_weight=0.5 if data.top_k else 0.0)
            t_first = time.process_time()
            for i, b in enumerate(batches):
                if i == a.warmup:
                    t0 = time.process_time()
                    warm = t0 - t_first
                loss = compute_losses(model, b, opts, forward=fwd)
                opt.zero_grad(set_to_none=True)
                loss.total.backward()
                opt.step()
            per = (time.process_time() - t0) / a.steps
            print(json.dumps({"draft_vocab": vocab, "mode": mode, "threads": a.threads, "layers": a.layers,
                              "cpu_s_per_step": round(per, 3), "warmup_cpu_s": round(warm, 1)}), flush=True)


def eval_drafts(a: argparse.Namespace) -> None:
    from pydflash2.train.evaluate import eval_prompts, evaluate_drafter

    target = resolve_target(a.target) if a.target == "smollm2" else Path(a.target)
    sets = {Path(f).name: eval_prompts(f, a.n) for f in a.prompt_files}
    for draft in a.drafts:
        for name, prompts in sets.items():
            r = evaluate_drafter(target, draft, prompts, max_tokens=a.max_tokens, device="CPU", n_threads=a.threads)
            r.pop("tokens")
            print(json.dumps({"draft": draft, "prompts_file": name, **r}), flush=True)


def near_ties(a: argparse.Namespace) -> None:
    """How often the target's greedy pick is a near-tie (top-1 minus top-2 log-probability under a
    gap), where batch numerics can flip the hard label; and how much probability the hard label
    leaves out (what soft labels add)."""
    import numpy as np

    from pydflash2.train.dataset import Dataset

    data = Dataset(a.data)
    gaps, top1 = [], []
    for i, s in enumerate(data.sequences):
        ids, logp = data.soft_labels(i)
        rows = slice(s.prompt_len - 1, s.length - 1)  # the generated positions
        lp = np.asarray(logp[rows], dtype=np.float32)
        gaps.append(lp[:, 0] - lp[:, 1])
        top1.append(np.exp(lp[:, 0]))
    g, p1 = np.concatenate(gaps), np.concatenate(top1)
    out = {"positions": int(len(g)), "mean_top1_prob": round(float(p1.mean()), 4),
           "share_top1_prob_below_0.5": round(float((p1 < 0.5).mean()), 4)}
    for t in (0.01, 0.05, 0.1):
        out[f"share_gap_below_{t}"] = round(float((g < t).mean()), 5)
    print(json.dumps(out))


def plot_scaling(a: argparse.Namespace) -> None:
    """Held-out tau against training CPU seconds (log axis), one line per prompt file, from the
    runs' summary.json and the eval subcommand's JSON lines; a log-linear fit extrapolated to tau 3."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    evals = [json.loads(line) for f in a.evals for line in Path(f).read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 4))
    fits = {}
    for name in sorted({e["prompts_file"] for e in evals}):
        pts = []
        for run in a.runs:
            cpu = json.loads((Path(run) / "summary.json").read_text())["cpu_seconds"]
            taus = [e["tau"] for e in evals if e["prompts_file"] == name and Path(e["draft"]).parent == Path(run)]
            if taus:
                pts.append((cpu / 3600, taus[-1]))
        if len(pts) < 3:  # too few runs measured on this prompt file for a line
            continue
        pts.sort()
        x, y = np.array(pts).T
        slope, icept = np.polyfit(np.log10(x), y, 1)
        fits[name] = {"points": [(round(float(a), 4), round(float(b), 3)) for a, b in pts],
                      "tau_per_decade": round(float(slope), 3),
                      "cpu_hours_for_tau_3": float(10 ** ((3 - icept) / slope)) if slope > 0 else None}
        ax.plot(x, y, "o-", label=f"{name} (+{slope:.2f} tau per 10x)")
    ax.set_xscale("log")
    ax.set_xlabel("training CPU-hours (1 thread, process time)")
    ax.set_ylabel("engine tau (T=0, n_max 7)")
    ax.axhline(3.0, color="grey", ls="--", lw=0.8)
    ax.set_title(a.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(json.dumps(fits))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    t = sub.add_parser("train")
    t.add_argument("--target", default="smollm2")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--layers", type=int, default=1)
    t.add_argument("--draft-vocab", type=int, default=8192)
    t.add_argument("--init-layers", default="none")
    t.add_argument("--soft-weight", type=float, default=0.0)
    t.add_argument("--old-selector", action="store_true", help="the previous selector loss (no gold slot, decayed)")
    t.add_argument("--selector-backbone", action="store_true")
    t.add_argument("--source", default="all", help="comma list of sources to train on (needs --sources)")
    t.add_argument("--sources", help="JSON {prompt index: source} of the data's prompt file")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--checkpoint-minutes", type=float, default=5.0)
    t.add_argument("--resume", action="store_true")
    t.set_defaults(func=train_variant)
    sp = sub.add_parser("speed")
    sp.add_argument("--target", default="smollm2")
    sp.add_argument("--data", required=True)
    sp.add_argument("--layers", type=int, default=1)
    sp.add_argument("--steps", type=int, default=10)
    sp.add_argument("--warmup", type=int, default=3)
    sp.add_argument("--threads", type=int, default=1)
    sp.add_argument("--modes", nargs="+", default=["eager", "compile"])
    sp.add_argument("--draft-vocabs", type=int, nargs="+", default=[8192])
    sp.set_defaults(func=step_speed)
    rx = sub.add_parser("reexport")
    rx.add_argument("--target", default="smollm2")
    rx.add_argument("--run", required=True)
    rx.add_argument("--data", required=True)
    rx.add_argument("--draft-vocab", type=int, required=True)
    rx.set_defaults(func=reexport)
    nt = sub.add_parser("ties")
    nt.add_argument("--data", required=True)
    nt.set_defaults(func=near_ties)
    pl = sub.add_parser("plot")
    pl.add_argument("--runs", nargs="+", required=True, help="run folders (summary.json with cpu_seconds)")
    pl.add_argument("--evals", nargs="+", required=True, help="JSON lines of the eval subcommand")
    pl.add_argument("--out", required=True)
    pl.add_argument("--title", default="held-out tau against training compute")
    pl.set_defaults(func=plot_scaling)
    e = sub.add_parser("eval")
    e.add_argument("--target", default="smollm2")
    e.add_argument("--drafts", nargs="+", required=True)
    e.add_argument("--prompt-files", nargs="+", required=True)
    e.add_argument("--n", type=int, default=32)
    e.add_argument("--max-tokens", type=int, default=64)
    e.add_argument("--threads", type=int, default=1)
    e.set_defaults(func=eval_drafts)
    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
