"""What the engine chose in a run, and what it measured, in words a person can read.

The engine's cost model decides every step (native cost_model.h: the draft length, a tree's budget,
the context's candidates alone or merged with the drafter's block), each decision with every option
it weighed, priced (`stats["decision"]`: a request's last; the engine's stats' "decisions": its last
step's). Its stats keep what it ran: per request, each plan its verify steps ran ("plain", "chain of
3", "tree of 16", "merged tree", "candidates' tree") with its steps, the committed tokens the cost
model expected of it and those it committed, and the rates it priced it and plain decoding at
(`stats["plans"]`). This module words those records; it decides nothing itself, so the
explanation can never tell the user something the engine did not do."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _native
from ._native import ffi, lib


def expected_tokens(acceptance: Sequence[float]) -> float:
    """Committed tokens per step (1 + expected accepted drafts) of a chain whose block positions are
    accepted with these conditional rates: the engines' formula (native draft_length.h)."""
    acc = np.ascontiguousarray(acceptance, dtype=np.float64)
    out = lib.pdf2_expected_tokens(ffi.cast("double *", ffi.from_buffer(acc)), len(acc))
    if out < 0:
        raise ValueError(_native.last_error())
    return float(out)


def merge_plans(runs: Iterable[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Several requests' plans as one record (steps summed, the taus weighted by steps, the priced
    rates by priced steps), in order of first use."""
    merged: dict[str, dict[str, Any]] = {}
    for plans in runs:
        for p in plans:
            m = merged.setdefault(p["plan"], {"plan": p["plan"], "steps": 0, "expected": 0.0, "committed": 0.0,
                                              "priced_steps": 0, "rate": 0.0, "plain_rate": 0.0})
            m["steps"] += p["steps"]
            m["expected"] += p["expected_tau"] * p["steps"]
            m["committed"] += p["tau"] * p["steps"]
            priced = p.get("priced_steps", 0)
            m["priced_steps"] += priced
            m["rate"] += p.get("expected_rate", 0.0) * priced
            m["plain_rate"] += p.get("plain_rate", 0.0) * priced
    return [{"plan": m["plan"], "steps": m["steps"], "expected_tau": m["expected"] / max(m["steps"], 1),
             "tau": m["committed"] / max(m["steps"], 1), "priced_steps": m["priced_steps"],
             "expected_rate": m["rate"] / max(m["priced_steps"], 1),
             "plain_rate": m["plain_rate"] / max(m["priced_steps"], 1)} for m in merged.values()]


def ran_most(plans: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The plan the engine ran in most steps (a tie: the one it ran first); None: no verify steps."""
    best = None
    for p in plans:
        if p["steps"] > 0 and (best is None or p["steps"] > best["steps"]):
            best = p
    return best


def _words(plan: str) -> str:
    kind, _, size = plan.partition(" of ")
    if kind == "chain":
        return f"a chain of {size} draft{'s' if size != '1' else ''}"
    if kind == "tree":
        return f"a tree of {size} node{'s' if size != '1' else ''}"
    return {"plain": "plain decoding", "merged tree": "the drafter's and the context's merged tree",
            "candidates' tree": "the context's tree alone (no propose)"}.get(plan, plan)


def _taus(p: Mapping[str, Any]) -> str:
    return f"expected tau {p['expected_tau']:.2f}, measured {p['tau']:.2f}"


def _priced(p: Mapping[str, Any]) -> str:
    """The rate the cost model priced the plan at where it ran it as chosen, against plain decoding's
    in the same decisions (empty: never priced so)."""
    if not p.get("priced_steps"):
        return ""
    text = f", priced at {p['expected_rate']:.1f} tok/s"
    if p["plan"] != "plain" and p.get("plain_rate"):
        text += f" against plain decoding's {p['plain_rate']:.1f}"
    return text


def explain_run(stats: Mapping[str, Any]) -> str | None:
    """What the engine ran in a finished run (a request's stats, or bench's merged ones): the plan
    its steps ran most with its expected and measured tau, then the others by steps (None: no verify
    steps)."""
    plans = list(stats.get("plans") or [])
    top = ran_most(plans)
    if top is None:
        return None
    total = sum(p["steps"] for p in plans)
    rest = sorted((p for p in plans if p is not top and p["steps"] > 0), key=lambda p: -p["steps"])
    text = f"auto: the engine ran {_words(top['plan'])} in {top['steps']} of {total} steps ({_taus(top)}){_priced(top)}"
    if rest:
        text += "; then " + "; ".join(f"{_words(p['plan'])} in {p['steps']} ({_taus(p)})" for p in rest[:3])
        if len(rest) > 3:
            text += f"; {len(rest) - 3} other plan{'s' if len(rest) > 4 else ''} in {sum(p['steps'] for p in rest[3:])}"
    return text + "."


def block_positions(stats: Mapping[str, Any]) -> int:
    """The block positions a run's acceptance is shown for: the drafter's block, or deeper where its
    trees (a context path) reached further."""
    drafted = list(stats["drafted_per_position"])
    deepest = max((i + 1 for i, d in enumerate(drafted) if d), default=0)
    return max(int(stats.get("max_draft", 0)), deepest)


def explain_tree_auto(stats: Mapping[str, Any]) -> str | None:
    """What tree_budget="auto" did in a run (its steps that verified a tree) and how the cost model
    weighed the tree against the chain at its last step, from a Speculator's stats (None without an
    automatic tree budget)."""
    model = stats.get("tree_auto")
    if not model:
        return None
    steps, trees = int(stats["n_steps"]), int(stats.get("n_tree_steps", 0))
    head = (f"auto tree: {trees} of {steps} steps verified a tree (up to {model['max_budget']} nodes; "
            f"{model['probes']} probe{'' if model['probes'] == 1 else 's'} over the engine's life)")
    if "tree_rate" not in model:
        return head + "."
    b, n = int(model["best_budget"]), int(model["chain_n"])
    chain = "plain decoding" if n == 0 else f"the chain of {n} draft{'s' if n > 1 else ''}"
    verdict = "a tree" if model["choice"] == "tree" else chain  # the engine's own choice (native cost_model)
    return (f"{head}. At its last step the model priced a tree of {b} node{'s' if b != 1 else ''} at tau "
            f"{model['tree_expected_tokens']:.2f}, "
            f"{model['tree_rate']:.1f} tok/s, against {chain} at tau {model['chain_expected_tokens']:.2f}, "
            f"{model['chain_rate']:.1f} tok/s" + (f" (plain {model['plain_rate']:.1f} tok/s)" if n else "") +
            f": it chose {verdict}.")
