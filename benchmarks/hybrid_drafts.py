"""Context drafts merged with the DFlash2 lattice (issue 35), against every source alone.

On the agentic set (benchmarks/prompts_agentic_eval.jsonl: tasks whose answers copy their context)
and the chat eval prompts (benchmarks/prompts_chat_eval.txt), at each temperature, interleaved
prompt by prompt so that machine noise hits every configuration alike, with the default pair
(SmolLM2-135M-Instruct and the shipped DFlash2 drafter) unless --model/--draft say otherwise:

- plain: no drafts (in the context made for trees: flash attention on, as every other row here);
- plain, flash off: what `generate --n-max 0 --context-drafts off` runs (a context of its own);
- lattice chain: the drafter's chain, n_max auto (the cost model's length);
- lattice tree 16: the best-first tree of 16 nodes over the lattice;
- context alone: context drafts without a drafter (the cost model prices each step's tree);
- merged tree 16: the lattice's and the context's candidates in one tree of 16 nodes;
- auto: what `pydflash2 generate` runs by default (n_max auto, context drafts "request");
- auto, lazy head / auto, full head: auto with the verifies' LM head set instead of chosen from the
  measured costs (NativeEngine.set_head_mode: cut before the head and run per row read, or every
  row's head in the decode's graph); the table's head column says what each configuration ran;
- perfect drafts (asked by name only): a bound, not a configuration: context drafts alone whose
  global cache already holds this prompt's answer (each prompt run twice, the second counted), so
  every step can draft the exact continuation and the cost model only chooses how deep; what
  speculation could reach on this machine if the drafts were always right (at T=0).

Prints per set and temperature: tau, median tokens/s, both as ratios to plain measured in the same
run, acceptance per depth, and the nodes drafted and accepted by source.

    python benchmarks/hybrid_drafts.py --threads 2 --max-tokens 128 [--n-prompts 24] [--temperatures 0,1]

--f32: the default target (or --model) requantized to F32 (pydflash2_testing.f32_target, made once and
cached), with the shipped drafter: a bandwidth-bound stand-in for a fast device (a verify of 8 rows
costs about 1.8 plain steps on a 2-core CPU, as on a GPU; the Q4_1 original about 4).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
AGENTIC = BENCH / "prompts_agentic_eval.jsonl"
CHAT = BENCH / "prompts_chat_eval.txt"


def load_sets(n: int) -> dict[str, list]:
    agentic = [json.loads(line)["messages"] for line in AGENTIC.read_text().splitlines() if line.strip()]
    chat = [[{"role": "user", "content": line.strip()}] for line in CHAT.read_text().splitlines() if line.strip()]
    # every category of the agentic set: spread the first n over the file
    step = max(1, len(agentic) // n) if n else 1
    return {"agentic": agentic[::step][:n or None], "chat": chat[:n or None]}


# The configurations, by name: the Speculator's arguments on the shared target context ("draft": the
# drafter, else none). benchmarks/gpu_check.py runs the same ones.
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {"n_max": 0},
    "lattice chain": {"draft": True, "n_max": "auto"},
    "chain 7": {"draft": True, "n_max": 7},
    "lattice tree 16": {"draft": True, "n_max": 7, "tree_budget": 16},
    "context alone": {"n_max": 0, "context_drafts": "request"},
    "merged tree 16": {"draft": True, "n_max": 7, "tree_budget": 16, "context_drafts": "request"},
    "auto": {"draft": True, "n_max": "auto", "context_drafts": "request"},
    "auto, lazy head": {"draft": True, "n_max": "auto", "context_drafts": "request", "head": "lazy"},
    "auto, full head": {"draft": True, "n_max": "auto", "context_drafts": "request", "head": "full"},
}


class PerfectDrafts:
    """The bound "perfect drafts" (above): generate() runs the request twice on a Speculator whose
    context drafts include its past outputs, and returns the second Completion."""

    def __init__(self, llm: Any) -> None:
        from pydflash2.speculator import Speculator

        self.spec = Speculator(llm, None, n_max=0, context_drafts="global")

    def generate(self, ids: list[int], **kwargs: Any) -> Any:
        self.spec.generate(ids, **kwargs)
        return self.spec.generate(ids, **kwargs)

    def close(self) -> None:
        self.spec.close()


def make_speculator(llm: Any, draft: str, name: str, **kwargs: Any) -> Any:
    """The configuration `name` of CONFIGS on the target `llm` (from load_target with tree_budget=16 and
    context_drafts="request"); kwargs go to the Speculator (device=...)."""
    from pydflash2.speculator import Speculator

    conf = dict(CONFIGS[name])
    uses_drafter = conf.pop("draft", False)
    head = conf.pop("head", None)
    spec = Speculator(llm, draft if uses_drafter else None, **conf, **(kwargs if uses_drafter else {}))
    if head is not None:
        spec._native.set_head_mode(head)
    return spec


def head_of(spec: Any) -> str:
    """The LM head the configuration's verifies run (engine_stats' "head"), "-" where none is chosen."""
    try:
        return str(spec.engine_stats()["head"])
    except (AttributeError, KeyError):
        return "-"



def run_interleaved(specs: dict[str, Any], prompts: list[list[int]], max_tokens: int,
                    temperature: float) -> dict[str, list[Any]]:
    """Every configuration on every prompt, interleaved prompt by prompt (machine noise hits all alike),
    seed 1000 + the prompt's index; the Completions by configuration."""
    runs: dict[str, list[Any]] = {n: [] for n in specs}
    for i, ids in enumerate(prompts):
        for name, spec in specs.items():
            runs[name].append(spec.generate(ids, max_tokens=max_tokens, temperature=temperature, seed=1000 + i))
    return runs


def summarize(stats: list[dict]) -> dict[str, Any]:
    """tau (tokens per step after the first), the median tokens/s over prompts, acceptance per depth
    1..8 and the nodes drafted / accepted by source."""
    steps = sum(s["n_steps"] for s in stats)
    tau = sum(s["n_generated"] - 1 for s in stats) / max(steps, 1)
    rate = statistics.median(s["tokens_per_second"] for s in stats)
    drafted = [sum(x) for x in zip(*(s["drafted_per_position"] for s in stats), strict=True)]
    accepted = [sum(x) for x in zip(*(s["accepted_per_position"] for s in stats), strict=True)]
    acc = " ".join(f"{a / d:.2f}" if d else "-" for a, d in zip(accepted[:8], drafted[:8], strict=True))
    src = {k: sum(s[k] for s in stats) for k in ("lattice_drafted", "lattice_accepted", "context_drafted",
                                                  "context_accepted", "propose_skipped")}
    return dict(tau=tau, rate=rate, acc=acc, **src)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--f32", action="store_true", help="the target requantized to F32 (above)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-prompts", type=int, default=24, help="per set (0: all)")
    ap.add_argument("--sets", default="agentic,chat")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--configs", default="plain,plain, flash off,lattice chain,lattice tree 16,context alone,"
                                         "merged tree 16,auto")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--json", default=None, help="write every run's stats here")
    args = ap.parse_args()

    from pydflash2.models import default_drafter, default_target
    from pydflash2.speculator import Speculator, load_target

    model = args.model or str(default_target())
    if args.f32:
        import _repo  # noqa: F401  (tests/support on sys.path: the fixture makers)
        from pydflash2_testing import f32_target

        model = str(f32_target(model))
    draft = args.draft or str(default_drafter())
    llm, inv = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, tree_budget=16, context_drafts="request")
    make = {name: (lambda name=name: make_speculator(llm, draft, name)) for name in CONFIGS}
    make["plain, flash off"] = lambda: Speculator(load_target(model, n_ctx=args.n_ctx, n_threads=args.threads)[0],
                                                  None, n_max=0)
    make["perfect drafts"] = lambda: PerfectDrafts(llm)
    # (a name with a comma in it is found in the list as written)
    names = [c for c in ["plain", "plain, flash off", *CONFIGS, "perfect drafts"] if c in args.configs.split(",") or
             "," in c and c in args.configs]
    names = list(dict.fromkeys(names))
    specs = {name: make[name]() for name in names}
    sets = load_sets(args.n_prompts)
    temps = [float(t) for t in args.temperatures.split(",")]
    print(f"model {Path(model).name}, drafter {Path(draft).name}, --threads {args.threads}, {args.max_tokens} tokens, "
          f"n_ctx {args.n_ctx}, flash attention on (trees), load average {os.getloadavg()[0]:.1f}")
    dump: dict = {}
    for set_name in args.sets.split(","):
        prompts = [specs["plain"].tokenize_prompt(m) for m in sets[set_name]]
        for temp in temps:
            t0 = time.time()
            runs = {name: [o.stats for o in outs] for name, outs in
                    run_interleaved(specs, prompts, args.max_tokens, temp).items()}
            print(f"\n{set_name}, {len(prompts)} prompts, T={temp:g} ({time.time() - t0:.0f} s, load average "
                  f"{os.getloadavg()[0]:.1f})")
            print("| configuration | tau | tau vs plain | tok/s | vs plain | lattice acc/drafted | context acc/drafted "
                  "| no-propose steps | acceptance per depth 1..8 | head |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            summary = {name: summarize(stats) for name, stats in runs.items()}
            base = summary.get("plain")
            for name, r in summary.items():
                vs_tau = f"{r['tau'] / base['tau']:.2f}x" if base else "-"
                vs_rate = f"{r['rate'] / base['rate']:.2f}x" if base else "-"
                print(f"| {name} | {r['tau']:.2f} | {vs_tau} | {r['rate']:.1f} | {vs_rate} "
                      f"| {r['lattice_accepted']}/{r['lattice_drafted']} "
                      f"| {r['context_accepted']}/{r['context_drafted']} "
                      f"| {r['propose_skipped']} | {r['acc'] or '-'} | {head_of(specs[name])} |")
            dump[f"{set_name} T={temp:g}"] = summary
            sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(dump, indent=1))
    for spec in specs.values():
        spec.close()
    print(f"\nbatch-invariant here: {bool(inv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
