"""The speculation tax (issue 57): what a step that feeds or verifies drafts costs beyond its rows.

On each capture path the target has ("tap": llama.cpp's layer-input taps, "callback": pydflash2's graph evaluation
callback; both on one target context made by load_target, flash attention on as for trees), with the
default pair unless --model/--draft say otherwise, or --f32 (SmolLM2 requantized to F32 here, a
bandwidth-bound stand-in for a fast device: pydflash2_testing.f32_target), it prints:

(a) the cost model's table, twice (Speculator.measure_costs: the plain step and a verify of 1..N rows,
    each timed alike, as the second of two decodes of its size): the one-row tax (a one-row verify
    with the drafter's features over the plain step) and N rows over the plain step;
(b) the steps as they ran, interleaved prompt by prompt over the agentic and chat eval prompts at T=0:
    plain decoding (no drafter: the plain step a user compares with), auto (what `generate` runs) and
    the chain of 7 on each path; per rows verified, the mean seconds of the real decodes (engine stats
    `decode_s_by_rows` / `decodes_by_rows`: the ledger's decode and sync of each step) against the
    table, and the fed one-row decodes (plain steps whose rows feed the drafter) against plain decoding's.

    python benchmarks/speculation_tax.py --threads 2 [--max-tokens 64] [--n-prompts 4] [--f32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import _repo  # noqa: E402,F401  (tests/support on sys.path: the fixture makers)
from hybrid_drafts import load_sets, run_interleaved  # noqa: E402

PATHS = ("tap", "callback")  # those the target has (llama.cpp's taps exist for some architectures only)


def mean_by_rows(stats: dict[str, Any], fed: bool) -> dict[int, tuple[int, float]]:
    """rows -> (decodes, mean seconds) of the real steps (engine stats since creation)."""
    prefix = "fed_" if fed else ""
    counts, seconds = stats[prefix + "decodes_by_rows"], stats[prefix + "decode_s_by_rows"]
    return {i + 1: (n, s / n) for i, (n, s) in enumerate(zip(counts, seconds, strict=True)) if n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--f32", action="store_true", help="the default target requantized to F32 (made here, cached)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-prompts", type=int, default=4, help="per set")
    ap.add_argument("--cost-reps", type=int, default=7)
    ap.add_argument("--n-ctx", type=int, default=2048)
    args = ap.parse_args()

    import pydflash2_testing as testing

    from pydflash2.models import default_drafter, default_target
    from pydflash2.speculator import Speculator, load_target

    model = str(args.model or default_target())
    model = str(testing.f32_target(model)) if args.f32 else model
    draft = args.draft or str(default_drafter())
    llm, _ = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, tree_budget=16, context_drafts="request")
    print(f"model {Path(model).name}, drafter {Path(draft).name}, --threads {args.threads}, "
          f"{args.max_tokens} tokens, n_ctx {args.n_ctx}, load average {os.getloadavg()[0]:.1f}")

    import llama_cpp

    from pydflash2.capture import capture_rule, model_arch

    rule = capture_rule(model_arch(llm._model.model), llama_cpp.llama_model_n_layer(llm._model.model))
    paths = [p for p in PATHS if p in rule.max_layer_by_path]
    print(f"capture paths of this {rule.arch} target: {', '.join(paths)} (the default: {rule.path})")
    specs: dict[str, Any] = {"plain": Speculator(llm, None, n_max=0)}
    for path in paths:
        specs[f"auto, {path}"] = Speculator(llm, draft, n_max="auto", context_drafts="request", capture=path)
        specs[f"chain 7, {path}"] = Speculator(llm, draft, n_max=7, capture=path)
    sets = load_sets(args.n_prompts)
    plain = specs["plain"]
    if plain.llm.metadata.get("tokenizer.chat_template"):
        prompts = [plain.tokenize_prompt(m) for s in ("agentic", "chat") for m in sets[s]]
    else:  # a base model (Gemma3-270M's GGUF): the messages' text, raw
        prompts = [plain.tokenize_prompt("\n\n".join(x["content"] for x in m), chat=False)
                   for s in ("agentic", "chat") for m in sets[s]]

    # (a) the table, twice per path
    tables: dict[str, list[tuple[float, list[float]]]] = {p: [] for p in paths}
    print("\n(a) the cost model's table (measure_costs, ms)")
    print("| path | run | plain step | verify 1 | 1 row / plain | verify 8 | 8 rows / plain |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run in (1, 2):
        for path in paths:
            costs = specs[f"chain 7, {path}"].measure_costs(prompts[0][:256], reps=args.cost_reps)
            plain, verify = float(costs["plain_s"]), list(costs["verify_s"])
            tables[path].append((plain, verify))
            print(f"| {path} | {run} | {1e3 * plain:.2f} | {1e3 * verify[0]:.2f} | {verify[0] / plain:.3f} "
                  f"| {1e3 * verify[-1]:.2f} | {verify[-1] / plain:.2f} |")
    sys.stdout.flush()

    # (b) the steps as they ran
    outs = run_interleaved(specs, prompts, args.max_tokens, 0.0)
    plain_ops = mean_by_rows(specs["plain"].engine_stats(), fed=False)
    plain_one = plain_ops[1][1] if 1 in plain_ops else float("nan")
    print(f"\n(b) the steps as they ran: {len(prompts)} prompts (agentic and chat), T=0; plain decoding's one-row "
          f"decode {1e3 * plain_one:.2f} ms over {plain_ops.get(1, (0, 0))[0]} steps")
    print("| configuration | tau | tok/s (median) "
          "| rows: decodes, ms in operation, ms in the table, operation / table "
          "| fed one-row decode / plain decoding's |")
    print("| --- | --- | --- | --- | --- |")
    for name, spec in specs.items():
        if name == "plain":
            continue
        path = name.rsplit(", ", 1)[1]
        table = [statistics.mean(v) for v in zip(*(t[1] for t in tables[path]), strict=True)]
        engine = spec.engine_stats()
        ops, fed = mean_by_rows(engine, fed=False), mean_by_rows(engine, fed=True)
        cells = []
        for rows, (n, sec) in sorted(ops.items()):
            ref = table[min(rows, len(table)) - 1]
            cells.append(f"{rows}: {n}, {1e3 * sec:.2f}, {1e3 * ref:.2f}, {sec / ref:.2f}")
        stats = [o.stats for o in outs[name]]
        steps = sum(s["n_steps"] for s in stats)
        tau = sum(s["n_generated"] - 1 for s in stats) / max(steps, 1)
        rate = statistics.median(s["tokens_per_second"] for s in stats)
        fed_one = f"{fed[1][1] / plain_one:.3f} ({fed[1][0]} steps)" if 1 in fed else "-"
        print(f"| {name} | {tau:.2f} | {rate:.1f} | {'; '.join(cells)} | {fed_one} |")
    for spec in specs.values():
        spec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
