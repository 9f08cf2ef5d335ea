"""The step ledger (native step_ledger.h): where each step's time goes, per configuration.

Every part of the engine's step is timed as one named part, exclusive of the parts inside it, so the
parts add up to the step; this prints them per step (ms) and per verified row (us) for plain
decoding, the chain of 7, the lattice tree of 16, context drafts alone, the merged tree of 16 and
auto (what `pydflash2 generate` runs), at each temperature, on the agentic and chat eval prompts,
interleaved prompt by prompt, with the default pair unless --model/--draft say otherwise.

Besides the parts: `host` is every part but the target's forward (decode, sync, head, prefill) and
the drafter's graphs (propose, inject): what a GPU cannot hide behind its decode; `steps vs wall` is
the ledger's total against the engine's steps timed from Python around the native call (the parts
add up to the step when it is 1.00). Each configuration first runs one warm-up request, not counted
(its graph builds and first allocations): the figures are the steady state's.

    python benchmarks/step_ledger.py --threads 2 --max-tokens 64 --n-prompts 4 [--temperatures 0,1]

--stand-in runs a CPU stand-in for a fast device instead: a target made here with SmolLM2's
tokenizer (49,152 tokens) and 2 narrow layers (n_embd 64), whose plain step takes a millisecond or
two on 2 threads, and a random DFlash2 drafter for it: host work then weighs as on a GPU, where the
target's decode is short. (Its drafts are random: the ledger, not tau, is what it shows.)

--f32 runs the default target (or --model) requantized to F32 (pydflash2_testing.f32_target, made
once and cached) with the shipped drafter: a bandwidth-bound stand-in for a fast device, whose verify
of 8 rows costs about 1.8 plain steps on this CPU (a GPU's flat verify curve) with real drafts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import _repo  # noqa: E402,F401  (tests/support on sys.path: the fixture makers)
from hybrid_drafts import load_sets, make_speculator, run_interleaved  # noqa: E402

PARTS = ("plan", "offers", "propose", "graph_setup", "select", "build", "decode", "sync", "head", "verify", "kv",
         "features", "inject", "sources", "prefill", "other")
DEVICE = ("decode", "sync", "head", "prefill", "propose", "inject")  # the target's forward, the drafter's graphs
HOST = tuple(p for p in PARTS if p not in DEVICE)


def summarize(stats: list[dict]) -> dict[str, float]:
    """Per-step ms of every part (prefill left out of the step: prompt chunks), per-row us, host."""
    steps = sum(s["n_steps"] for s in stats)
    rows = sum(s["phases"]["rows"] - (s["n_prompt"] - s["n_reused"]) for s in stats)
    out = {p: 1e3 * sum(s["phases"][p + "_s"] for s in stats) / max(steps, 1) for p in PARTS}
    out["python"] = 1e3 * sum(s["phases"]["python_s"] for s in stats) / max(steps, 1)
    out["host"] = sum(out[p] for p in HOST)
    out["step"] = sum(out[p] for p in PARTS if p != "prefill")
    out["rows"] = rows / max(steps, 1)
    out["host_us_per_row"] = 1e3 * out["host"] / max(out["rows"], 1e-9)
    ledger = sum(sum(s["phases"][p + "_s"] for p in PARTS) for s in stats)
    out["ledger_vs_wall"] = ledger / max(sum(s["engine_step_s"] for s in stats), 1e-12)
    out["tau"] = sum(s["n_generated"] - 1 for s in stats) / max(steps, 1)
    return out


COLUMNS = (*PARTS, "python", "step", "host", "rows", "host_us_per_row", "tau", "ledger_vs_wall")


def ledger_table(ledgers: dict[str, dict[str, float]]) -> list[str]:
    """The markdown table of summarize()'s figures, a row per configuration."""
    lines = ["| configuration | " + " | ".join(COLUMNS) + " |", "| --- " * (len(COLUMNS) + 1) + "|"]
    for name, r in ledgers.items():
        cells = [f"{r[c]:.3f}" if c not in ("rows", "tau", "ledger_vs_wall", "host_us_per_row") else f"{r[c]:.2f}"
                 for c in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def stand_in(smollm2: str) -> tuple[str, str]:
    """The stand-in pair (made once under ~/.cache/pydflash2/stand-in): SmolLM2's tokenizer, 2 layers."""
    from pydflash2_testing import TargetSpec, make_random_drafter_for, make_target_gguf

    out = Path(os.environ.get("PYDFLASH2_CACHE_DIR", Path.home() / ".cache" / "pydflash2")) / "stand-in"
    out.mkdir(parents=True, exist_ok=True)
    target, draft = out / "target.gguf", out / "drafter.gguf"
    if not target.exists():
        make_target_gguf(target, TargetSpec(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
                                            tokenizer_from=smollm2))
    if not draft.exists():
        make_random_drafter_for(target, draft)
    return str(target), str(draft)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-prompts", type=int, default=4, help="per set")
    ap.add_argument("--sets", default="agentic,chat")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--configs", default="plain,chain 7,tree 16,context alone,merged 16,auto")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--stand-in", action="store_true", help="a narrow target with SmolLM2's vocabulary (above)")
    ap.add_argument("--f32", action="store_true", help="the default target requantized to F32 (below)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="count each configuration's first request (its graph builds and first allocations)")
    args = ap.parse_args()

    from pydflash2.models import default_drafter, default_target
    from pydflash2.speculator import load_target

    model = args.model or str(default_target())
    draft = args.draft or str(default_drafter())
    if args.stand_in:
        model, draft = stand_in(model)
    if args.f32:
        from pydflash2_testing import f32_target

        model = str(f32_target(model))
    llm, _ = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, tree_budget=16, context_drafts="request")
    # this script's short names for hybrid_drafts.CONFIGS
    configs = {"plain": "plain", "chain 7": "chain 7", "tree 16": "lattice tree 16", "context alone": "context alone",
               "merged 16": "merged tree 16", "auto": "auto"}
    names = [c for c in args.configs.split(",") if c in configs]
    specs = {name: make_speculator(llm, draft, configs[name]) for name in names}
    sets = load_sets(args.n_prompts)
    print(f"model {Path(model).name}, drafter {Path(draft).name}, --threads {args.threads}, {args.max_tokens} "
          f"tokens, n_ctx {args.n_ctx}, flash attention on, load average {os.getloadavg()[0]:.1f}")
    if not args.no_warmup:
        # a configuration's first request builds and allocates what later steps reuse: the steady
        # state's host work is the claim (the first pass measured up to 0.05 ms a step more)
        first = specs[names[0]].tokenize_prompt(sets[args.sets.split(",")[0]][0])
        run_interleaved(specs, [first], args.max_tokens, 0.0)
        print("(a warm-up request per configuration, not counted: --no-warmup counts it)")
    for set_name in args.sets.split(","):
        prompts = [specs[names[0]].tokenize_prompt(m) for m in sets[set_name]]
        for temp in (float(t) for t in args.temperatures.split(",")):
            t0 = time.time()
            runs = {name: [o.stats for o in outs] for name, outs in
                    run_interleaved(specs, prompts, args.max_tokens, temp).items()}
            print(f"\n{set_name}, {len(prompts)} prompts, T={temp:g} ({time.time() - t0:.0f} s): ms per step "
                  f"(prefill: ms per step spent on prompt chunks, all of their work, outside the step column)")
            print("\n".join(ledger_table({name: summarize(stats) for name, stats in runs.items()})))
            sys.stdout.flush()
    for spec in specs.values():
        spec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
