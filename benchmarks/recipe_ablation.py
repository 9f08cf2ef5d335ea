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


def eval_drafts(a: argparse.Namespace) -> None:
    from pydflash2.train.evaluate import eval_prompts, evaluate_drafter

    target = resolve_target(a.target) if a.target == "smollm2" else Path(a.target)
    sets = {Path(f).name: eval_prompts(f, a.n) for f in a.prompt_files}
    for draft in a.drafts:
        for name, prompts in sets.items():
            r = evaluate_drafter(target, draft, prompts, max_tokens=a.max_tokens, device="CPU", n_threads=a.threads)
            r.pop("tokens")
            print(json.dumps({"draft": draft, "prompts_file": name, **r}), flush=True)


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
