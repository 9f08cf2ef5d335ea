"""Tree verification against the chain, measured with the real engine on the real target and drafter.

For every temperature, the same prompts run through Speculators over one target: plain decoding, the
chain (the greedy selector's n_max drafts, today's verify), trees of B drafted nodes (--tree-budget), the
automatic choices (n_max auto, and tree_budget auto: each step the chain or a tree, whichever the
measured costs price faster; once more with every verify row priced as the first, what a GPU's costs
would make it choose), each prompt in turns over the configurations so that machine noise hits all
alike. Per configuration:

- tau: committed tokens per target forward (the engine's counts; the first token, from the prompt's
  forward, left out). Where verify rows cost about as much as one row (a GPU at these sizes), tau is
  the speed-up over plain decoding before the drafter's cost: a projection, not measured here;
- tau against the chain's, and the acceptance per depth (of the steps that reached depth j, the
  share that accepted it);
- rows per step (the target decode's rows) and the step's phases in ms per step;
- tokens/s on this CPU, against the chain and against plain decoding, side by side in one run.

    python benchmarks/tree_verify.py [--prompts 24] [--max-tokens 64] [--budgets 4,8,16,32]
                                     [--temperatures 0,1] [--threads 1] [--n-max 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from pydflash2.bench import PHASE_COLUMNS
from pydflash2.draft_decision import explain_tree_auto
from pydflash2.models import default_drafter, default_target
from pydflash2.speculator import Speculator, load_target
from pydflash2.train.prompts import read_prompts

EVAL = Path(__file__).with_name("prompts_chat_eval.txt")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--prompts", type=int, default=24, help="the first N of benchmarks/prompts_chat_eval.txt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-max", type=int, default=7, help="the chain's drafts, the trees' depth")
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=448, help="under 512: flash attention stays batch-invariant")
    args = ap.parse_args()
    model = args.model or str(default_target())
    draft = args.draft or str(default_drafter())
    budgets = [int(b) for b in args.budgets.split(",") if b]
    temps = [float(t) for t in args.temperatures.split(",")]
    prompts = read_prompts(EVAL)[: args.prompts]

    # one target context for all: unified KV cache, 1 + max budget sequences, flash attention (load_target)
    llm, inv = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, tree_budget=max(budgets))
    specs: dict[str, Speculator] = {"plain": Speculator(llm, None, n_max=0),
                                    "chain": Speculator(llm, draft, n_max=args.n_max)}
    for b in budgets:
        specs[f"tree {b}"] = Speculator(llm, draft, n_max=args.n_max, tree_budget=b)
    specs["chain auto"] = Speculator(llm, draft, n_max="auto")
    specs["tree auto"] = Speculator(llm, draft, n_max="auto", tree_budget="auto")
    specs["tree auto, rows free"] = free = Speculator(llm, draft, n_max="auto", tree_budget="auto")
    assert free.costs is not None  # a GPU's verify: every row count costs what one row costs here
    free.set_costs([free.costs["verify_s"][0]] * free.max_verify_rows, free.costs["draft_s"])
    print(f"{len(prompts)} chat prompts x {args.max_tokens} tokens, n_max {args.n_max}, {args.threads} thread(s), "
          f"flash attention on, n_ctx {args.n_ctx}, batch-invariant here: {bool(inv)}; load average "
          f"{os.getloadavg()[0]:.1f} before")
    for temp in temps:
        runs: dict[str, list[dict]] = {name: [] for name in specs}
        rows: dict[str, int] = dict.fromkeys(specs, 0)
        for i, prompt in enumerate(prompts):
            for name, spec in specs.items():
                rows0 = spec.engine_stats()["n_rows"]
                out = spec.generate(prompt, max_tokens=args.max_tokens, temperature=temp, seed=1000 + i)
                runs[name].append(out.stats)
                rows[name] += spec.engine_stats()["n_rows"] - rows0
        print(f"\nT={temp:g} (load average {os.getloadavg()[0]:.1f})")
        print("| configuration | tau | tau vs chain | acceptance per depth 1..n | rows/step | tok/s | vs chain "
              "| vs plain |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        summary = {}
        for name, stats in runs.items():
            steps = sum(s["n_steps"] for s in stats)
            tau = sum(s["n_generated"] - 1 for s in stats) / max(steps, 1)
            rate = statistics.median(s["tokens_per_second"] for s in stats)
            drafted = [sum(x) for x in zip(*(s["drafted_per_position"] for s in stats), strict=True)]
            accepted = [sum(x) for x in zip(*(s["accepted_per_position"] for s in stats), strict=True)]
            acc = " ".join(f"{a / d:.2f}" if d else "-" for a, d in zip(accepted, drafted, strict=True))
            # rows of the decodes after each prompt's forward: the prompt's own rows taken out
            prompt_rows = sum(s["n_prompt"] - s["n_reused"] for s in stats)
            summary[name] = dict(tau=tau, rate=rate, rows=(rows[name] - prompt_rows) / max(steps, 1), acc=acc,
                                 phases={k: sum(s["phases"].get(f"{k}_s", 0.0) for s in stats) * 1e3 / max(steps, 1)
                                         for k in PHASE_COLUMNS})
        for name, r in summary.items():
            print(f"| {name} | {r['tau']:.2f} | {r['tau'] / summary['chain']['tau']:.2f}x | {r['acc'] or '-'} "
                  f"| {r['rows']:.1f} | {r['rate']:.1f} | {r['rate'] / summary['chain']['rate']:.2f}x "
                  f"| {r['rate'] / summary['plain']['rate']:.2f}x |")
        print("\nms per step: " + " | ".join(PHASE_COLUMNS))
        for name, r in summary.items():
            print(f"  {name:9s} " + " | ".join(f"{r['phases'][k]:.1f}" for k in PHASE_COLUMNS))
        for name in ("tree auto", "tree auto, rows free"):
            stats = runs[name]
            n_steps, n_trees = sum(s["n_steps"] for s in stats), sum(s["n_tree_steps"] for s in stats)
            print(f"{name}: " + (explain_tree_auto({**stats[-1], "n_steps": n_steps, "n_tree_steps": n_trees})
                                 or ""))
    for spec in specs.values():
        spec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
