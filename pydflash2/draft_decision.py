"""Why n_max="auto" drafts what it drafts (and tree_budget="auto" verifies what it verifies), in
one sentence a person can read.

The engines pick the draft count n that maximises expected committed tokens per second from the
measured verify costs (a target decode of 1..n_max+1 rows), the drafter's cost, and a running
estimate of each block position's acceptance (native `draft_length`). This module applies the same
native cost model to the same inputs and words the outcome: what auto chose, what drafting would
have to reach to pay on this machine (the break-even tau), and what this drafter reached."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native
from ._native import ffi, lib

# The engines' prior for a block position never drafted (native step_price.h)
_PRIOR_ACCEPTED, _PRIOR_REACHED = float(lib.pdf2_draft_prior_accepted()), float(lib.pdf2_draft_prior_reached())


@dataclass(frozen=True)
class AutoDecision:
    """The cost model's verdict; index n of each tuple is "n drafts per step" (0 = plain decoding)."""

    n: int
    expected_tau: tuple[float, ...]  # committed tokens per target forward
    rate: tuple[float, ...]  # committed tokens per second
    break_even_tau: tuple[float, ...]  # the tau at which n drafts match plain decoding's rate
    verify_ratio: float  # a verify of n_max+1 rows over one row

    @property
    def n_max(self) -> int:
        return len(self.rate) - 1

    @property
    def speedup(self) -> float:
        """Expected tokens/s of the chosen n over plain decoding's."""
        return self.rate[self.n] / self.rate[0]

    def message(self) -> str:
        m = self.n_max
        if self.n == 0:
            return (f"auto: plain decoding. Verifying {m + 1} rows costs {self.verify_ratio:.1f}x one row on this "
                    f"machine, so {m} drafts pay only above tau {self.break_even_tau[m]:.2f} (1 draft above "
                    f"{self.break_even_tau[1]:.2f}); this drafter's estimate is tau {self.expected_tau[m]:.2f} "
                    f"at {m} drafts ({self.expected_tau[1]:.2f} at 1). --n-max {m} shows the drafter at work.")
        return (f"auto: {self.n} draft{'s' if self.n > 1 else ''} per step: expected tau "
                f"{self.expected_tau[self.n]:.2f} against a break-even of {self.break_even_tau[self.n]:.2f} on this "
                f"machine, about {self.speedup:.2f}x plain decoding's tokens/s.")


def acceptance_estimate(drafted: Sequence[int], accepted: Sequence[int]) -> list[float]:
    """Conditional acceptance of each block position from a run's counts, with the engines' prior
    (a position never drafted counts as 1 accepted in 2)."""
    return [(a + _PRIOR_ACCEPTED) / (d + _PRIOR_REACHED) for d, a in zip(drafted, accepted, strict=True)]


def expected_tokens(acceptance: Sequence[float]) -> float:
    """Committed tokens per step (1 + expected accepted drafts) of a chain whose block positions are
    accepted with these conditional rates: the engines' formula (native draft_length.h)."""
    acc = np.ascontiguousarray(acceptance, dtype=np.float64)
    out = lib.pdf2_expected_tokens(ffi.cast("double *", ffi.from_buffer(acc)), len(acc))
    if out < 0:
        raise ValueError(_native.last_error())
    return float(out)


def decide(verify_s: Sequence[float], draft_s: Sequence[float], acceptance: Sequence[float]) -> AutoDecision:
    """The draft count the engines' cost model picks for these costs and acceptances.

    verify_s[B-1]: seconds for a target decode of B rows (B = 1..n_max+1); draft_s[n-1]: seconds to
    propose n drafts; acceptance[i-1]: conditional acceptance of block position i."""
    n_max = len(draft_s)
    verify = np.ascontiguousarray(verify_s, dtype=np.float64)
    draft = np.ascontiguousarray(draft_s, dtype=np.float64)
    accept = np.ascontiguousarray(acceptance, dtype=np.float64)
    if len(verify) != n_max + 1 or len(accept) != n_max:
        raise ValueError(f"need {n_max + 1} verify costs and {n_max} acceptances for {n_max} draft costs, "
                         f"got {len(verify)} and {len(accept)}")
    expected = np.zeros(n_max + 1, dtype=np.float64)
    rate = np.zeros(n_max + 1, dtype=np.float64)

    def ptr(a: np.ndarray) -> Any:
        return ffi.cast("double *", ffi.from_buffer(a))

    n = lib.pdf2_draft_length_rates(ptr(verify), len(verify), ptr(draft), n_max, ptr(accept), ptr(expected),
                                    ptr(rate))
    if n < 0:
        raise ValueError(_native.last_error())
    # tau / (verify of n+1 rows + drafting n) = 1 / verify of one row
    break_even = [1.0] + [(verify[k] + draft[k - 1]) / verify[0] for k in range(1, n_max + 1)]
    return AutoDecision(n=int(n), expected_tau=tuple(expected.tolist()), rate=tuple(rate.tolist()),
                        break_even_tau=tuple(break_even), verify_ratio=float(verify[-1] / verify[0]))


def explain_run(costs: Mapping[str, Sequence[float]] | None, stats: Mapping[str, Any]) -> str | None:
    """The auto decision for a finished run: its measured costs and the acceptance it observed
    (None when the run had no cost model: a fixed n_max or no drafter)."""
    if not costs or not costs.get("draft_s"):
        return None
    drafted, accepted = stats["drafted_per_position"], stats["accepted_per_position"]
    n_max = len(costs["draft_s"])
    acceptance = acceptance_estimate(list(drafted)[:n_max], list(accepted)[:n_max])
    # (the costs of trees, automatic or the context's, extend verify_s beyond the chain's n_max + 1 rows)
    return decide(costs["verify_s"][: n_max + 1], costs["draft_s"], acceptance).message()


def explain_tree_auto(stats: Mapping[str, Any]) -> str | None:
    """What tree_budget="auto" did in a run (its steps that verified a tree) and what its cost model
    weighs now, from a Speculator's stats (None without an automatic tree budget)."""
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
    return (f"{head}. Now the model prices a tree of {b} node{'s' if b != 1 else ''} at tau "
            f"{model['tree_expected_tokens']:.2f}, "
            f"{model['tree_rate']:.1f} tok/s, against {chain} at tau {model['chain_expected_tokens']:.2f}, "
            f"{model['chain_rate']:.1f} tok/s" + (f" (plain {model['plain_rate']:.1f} tok/s)" if n else "") +
            f": {verdict} next.")
