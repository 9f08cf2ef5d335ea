"""`pydflash2 bench`: every configuration over a prompt set, interleaved so that
machine noise hits all of them alike; ratios against plain decoding measured
in the same run."""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .draft_decision import block_positions, explain_run, explain_tree_auto, merge_plans
from .draft_tree import tree_budget_spec

DEFAULT_PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain why the sky is blue in two sentences.",
    "List five uses of a paperclip.",
    "Write a Python function that reverses a string.",
    "What is the capital of France, and what is it famous for?",
    "Describe the water cycle.",
    "Give me three tips for a job interview.",
    "Translate 'good morning, how are you?' into French.",
]


@dataclass
class BenchConfig:
    """One benchmark run: every (n_max, selector, temperature) over the prompts."""

    model: str
    draft: str | None
    prompts: list[str]
    n_maxes: list[int | str]
    temperatures: list[float]
    selectors: list[str]
    max_tokens: int = 64
    repeats: int = 2
    chat: bool = True
    n_ctx: int = 4096
    n_threads: int | None = None
    device: str | None = "auto"
    rpc_servers: str | None = None
    n_gpu_layers: int = 0
    out_dir: Path = field(default_factory=lambda: Path("bench_out"))
    exact: bool = False  # refuse unless greedy output is bit-identical to plain decoding
    tree_budgets: list[int | str] = field(default_factory=lambda: [0])  # > 0: tree verification (every drafting n_max)
    # "request"/"global": every configuration also with context drafts (pydflash2.context_drafts);
    # n_max 0 with them: context drafts alone
    context_drafts: list[str] = field(default_factory=lambda: ["off"])


def run_bench(cfg: BenchConfig) -> int:
    from .speculator import Speculator, load_target

    prompts = cfg.prompts
    n_maxes = list(cfg.n_maxes)
    if 0 not in n_maxes:
        n_maxes.insert(0, 0)
    temperatures = cfg.temperatures
    selectors = cfg.selectors
    if not cfg.draft:
        n_maxes = [0]

    if cfg.rpc_servers:
        from .devices import add_rpc_servers

        add_rpc_servers(cfg.rpc_servers)  # before the target loads: it may offload to them
    trees = [0, *dict.fromkeys(t for t in cfg.tree_budgets if t != 0)] if cfg.draft else [0]
    contexts = ["off", *dict.fromkeys(c for c in cfg.context_drafts if c != "off")]
    llm, _ = load_target(cfg.model, n_ctx=cfg.n_ctx, n_threads=cfg.n_threads, exact=cfg.exact,
                         n_gpu_layers=cfg.n_gpu_layers, tree_budget=max(tree_budget_spec(t)[0] for t in trees),
                         context_drafts=contexts[-1])
    # a configuration: (n_max, selector, tree budget, context drafts); plain decoding has no selector
    # or tree (with context drafts: the context's drafts alone)
    specs: dict[tuple[Any, str, int | str, str], Speculator] = {}
    for n_max, selector, tree, ctx in itertools.product(n_maxes, selectors, trees, contexts):
        key = (n_max, "-", 0, ctx) if n_max == 0 else (n_max, selector, tree, ctx)
        if key not in specs:
            specs[key] = Speculator(llm, cfg.draft if n_max != 0 else None, n_max=n_max, selector=selector,
                                    device=cfg.device, exact=cfg.exact, tree_budget=key[2], context_drafts=ctx)
    configs = [(*key, t) for key in specs for t in temperatures]
    runs: dict[tuple[Any, str, int | str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for rep in range(cfg.repeats):
        for i, prompt in enumerate(prompts):
            for n_max, sel, tree, ctx, temp in configs:
                out = specs[(n_max, sel, tree, ctx)].generate(prompt, max_tokens=cfg.max_tokens,
                                                              temperature=temp, seed=1000 * rep + i, chat=cfg.chat)
                runs[(n_max, sel, tree, ctx, temp)].append(out.stats)
        print(f"repeat {rep + 1}/{cfg.repeats} done", file=sys.stderr)
    for spec in specs.values():
        spec.close()

    results = []
    for (n_max, sel, tree, ctx, temp), stats in runs.items():
        tokens = sum(s["completion_tokens"] - 1 for s in stats)
        decode_s = sum(s["total_s"] - s["ttft_s"] for s in stats)
        steps = sum(s["n_steps"] for s in stats)
        drafted = np.sum([s["drafted_per_position"] for s in stats], axis=0) if stats[0]["drafted_per_position"] else []
        accepted = np.sum([s["accepted_per_position"] for s in stats], axis=0) if len(drafted) else []
        # the block's positions (a context path may reach deeper)
        width = block_positions({"max_draft": stats[0]["max_draft"], "drafted_per_position": list(drafted)})
        drafted, accepted = drafted[:width], accepted[:width]
        plans = merge_plans(s["plans"] for s in stats)  # what the engine ran, over the runs
        phases = {k: float(sum(s["phases"][k] for s in stats)) for k in stats[0]["phases"]}
        results.append({
            "n_max": n_max, "selector": sel, "tree_budget": tree, "context_drafts": ctx, "temperature": temp,
            "runs": len(stats),
            # where the time went, summed over the runs (seconds; n_steps: target forwards), and per step
            "phases": phases,
            "phase_ms_per_step": {k[:-2]: 1e3 * v / max(phases["n_steps"], 1) for k, v in phases.items()
                                  if k.endswith("_s")},
            "total_s": float(sum(s["total_s"] for s in stats)),
            "tokens_per_second": tokens / max(decode_s, 1e-9),
            # committed per target forward, counted by the engine (tokens cut by EOS/stop included)
            "tau": sum(s["n_generated"] - 1 for s in stats) / max(steps, 1),
            "ttft_s": float(np.mean([s["ttft_s"] for s in stats])),
            "drafted_per_position": [int(x) for x in drafted],
            "accepted_per_position": [int(x) for x in accepted],
            "acceptance_per_position": [float(a) / d if d else None for a, d in zip(accepted, drafted, strict=True)],
            "plans": plans,
            # drafted tree nodes (chain drafts) and accepted ones, by source
            **{k: int(sum(s[k] for s in stats)) for k in ("lattice_drafted", "lattice_accepted", "context_drafted",
                                                           "context_accepted", "context_steps", "propose_skipped")},
        })
        if "auto" in (n_max, tree):  # what the engine chose over these runs, and what it measured
            tree_view = None
            if tree == "auto":  # the share of steps that verified a tree, and the model's last weighing
                results[-1]["tree_steps"] = sum(s["n_tree_steps"] for s in stats)
                tree_view = explain_tree_auto({**stats[-1], "n_steps": steps,
                                               "n_tree_steps": results[-1]["tree_steps"]})
            results[-1]["auto_decision"] = " ".join(x for x in (explain_run({"plans": plans}), tree_view) if x)
    for r in results:
        base = next(b for b in results if b["n_max"] == 0 and b["context_drafts"] == "off"
                    and b["temperature"] == r["temperature"])
        r["speedup_vs_plain"] = r["tokens_per_second"] / base["tokens_per_second"]

    out_dir = cfg.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"model": cfg.model, "draft": cfg.draft, "prompts": len(prompts), "repeats": cfg.repeats,
            "max_tokens": cfg.max_tokens,
            "exact": all(st["exact"] for sts in runs.values() for st in sts)}
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    plotted = _plot(results, out_dir)
    _print_table(results)
    for r in results:
        if r.get("auto_decision"):
            print(f"T={r['temperature']:g} {r['selector']}: {r['auto_decision']}", file=sys.stderr)
    print(f"wrote {out_dir / 'bench.json'}" + (" and PNG plots" if plotted else
          " (no PNG plots: matplotlib is not installed; pip install 'pydflash2[bench]')"), file=sys.stderr)
    return 0


def _label(r: dict[str, Any]) -> str:
    sel = "" if r["n_max"] == 0 else f" {r['selector']}" + (f" tree={r['tree_budget']}" if r["tree_budget"] else "")
    ctx = "" if r.get("context_drafts", "off") == "off" else f" ctx={r['context_drafts']}"
    return f"n_max={r['n_max']}{sel}{ctx} T={r['temperature']:g}"


def _print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'configuration':<34} {'tok/s':>9} {'tau':>6} {'vs plain':>9}  acceptance per position")
    for r in results:
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["acceptance_per_position"])
        print(f"{_label(r):<34} {r['tokens_per_second']:9.1f} {r['tau']:6.2f} {r['speedup_vs_plain']:8.2f}x  {acc}")
    print_phases(results, _label)


# the step ledger's parts (native step_ledger.h) and the Python side
PHASE_COLUMNS = ("plan", "offers", "propose", "graph_setup", "select", "build", "decode", "sync", "head", "verify",
                 "kv", "features", "inject", "sources", "prefill", "other", "python")


def print_phases(rows: list[dict[str, Any]], label: Any) -> None:
    """Per-step milliseconds of each phase (rows carry phase_ms_per_step, as bench results do)."""
    print(f"{'ms per step':<34} " + " ".join(f"{c[:9]:>9}" for c in PHASE_COLUMNS))
    for r in rows:
        ms = r["phase_ms_per_step"]
        print(f"{label(r):<34} " + " ".join(f"{ms.get(c, 0.0):9.2f}" for c in PHASE_COLUMNS))


def _plot(results: list[dict[str, Any]], out_dir: Path) -> bool:
    """throughput.png and acceptance.png; False without matplotlib (the `bench` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [_label(r) for r in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.5 * len(results) + 2))
    ax1.barh(labels, [r["tokens_per_second"] for r in results])
    ax1.set_xlabel("tokens / s")
    ax2.barh(labels, [r["tau"] for r in results])
    ax2.set_xlabel("tau (committed tokens per target forward)")
    ax2.set_yticklabels([])
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=100)
    plt.close(fig)

    # acceptance per block position: one curve per configuration that drafted, integer
    # positions, and the number of drafted tokens behind each point (suffix decay at a glance)
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    max_pos = 0
    for r, label in zip(results, labels, strict=True):
        acc, drafted = r["acceptance_per_position"], r["drafted_per_position"]
        points = [(i + 1, a, d) for i, (a, d) in enumerate(zip(acc, drafted, strict=True)) if a is not None and d]
        if not points:
            continue
        xs, ys, _ = zip(*points, strict=True)
        max_pos = max(max_pos, xs[-1])
        (line,) = ax.plot(xs, ys, marker="o", label=f"{label} (tau {r['tau']:.2f})")
        for x, y, d in points:
            ax.annotate(str(d), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                        color=line.get_color())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0.5, max(max_pos, 1) + 0.5)
    ax.set_xlabel("block position (drafted token number)")
    ax.set_ylabel("acceptance (given the positions before it were accepted)")
    ax.set_title("numbers: drafted tokens behind each point", fontsize=9)
    ax.set_ylim(0, 1.08)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "acceptance.png", dpi=100)
    plt.close(fig)
    return True
