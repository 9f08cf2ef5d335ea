"""Per-request figures in every answer, as llama-server's `timings` object
(prompt_n, prompt_ms, predicted_n, predicted_ms, their per-token ms and per
second, cache_n, draft_n, draft_n_accepted) plus speculation's: `tau` (tokens
committed per target verify step after the first token), `n_steps`, and the engine's step ledger
while the request ran (`ledger`: milliseconds per step of each part).

The scheduler's clock sees every commit; the drafted count needs the engine's
per-slot counters (its slot_stats(slot), drafted_per_position), and is
left out where the engine keeps none (llama-server also leaves draft_n out
when nothing was drafted)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestClock:
    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens the slot already held (not prefilled again)
    t_start: float = field(default_factory=time.perf_counter)  # the request got its slot
    t_first: float | None = None  # the prefill ended: first token
    n_committed: int = 0  # tokens the engine committed (some may fall after a stop)
    n_steps: int = 0  # verify steps after the first token
    ledger0: dict[str, Any] | None = None  # the engine's step ledger when the request got its slot

    def commit(self, n: int, now: float) -> None:
        if self.t_first is None:
            self.t_first = now
        else:
            self.n_steps += 1
        self.n_committed += n


def _rate(n: int, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second)."""
    return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)


def ledger_per_step(ledger0: dict[str, Any], ledger: dict[str, Any]) -> dict[str, Any]:
    """The engine's step ledger (native step_ledger.h) between two snapshots: the steps, their rows,
    and each part's milliseconds per step (the engine's steps while the request ran: shared with the
    requests beside it)."""
    steps = int(ledger["steps"] - ledger0["steps"])
    out: dict[str, Any] = {"steps": steps, "rows": int(ledger["rows"] - ledger0["rows"])}
    for key, value in ledger.items():
        if key.endswith("_s"):
            out[key[:-2] + "_ms"] = 1e3 * (value - ledger0[key]) / steps if steps else 0.0
    return out


def timings(clock: RequestClock, t_end: float, n_predicted: int,
            slot_stats: dict[str, Any] | None = None, ledger: dict[str, Any] | None = None) -> dict[str, Any]:
    t_first = clock.t_first if clock.t_first is not None else t_end
    prompt_n = clock.n_prompt - clock.n_cached
    prompt_ms = 1e3 * (t_first - clock.t_start)
    predicted_ms = 1e3 * (t_end - t_first)
    p_tok, p_sec = _rate(prompt_n, prompt_ms)
    g_tok, g_sec = _rate(n_predicted, predicted_ms)
    out: dict[str, Any] = {
        "cache_n": clock.n_cached,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
        "predicted_n": n_predicted, "predicted_ms": predicted_ms, "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_sec,
        "n_steps": clock.n_steps,
        "tau": (clock.n_committed - 1) / clock.n_steps if clock.n_steps else 0.0,
    }
    accepted = max(0, clock.n_committed - 1 - clock.n_steps)  # each verify step commits its accepted drafts + 1
    if slot_stats is not None and "drafted_per_position" in slot_stats:
        drafted = int(sum(slot_stats["drafted_per_position"]))
        if drafted:
            out["draft_n"] = drafted
            out["draft_n_accepted"] = int(sum(slot_stats.get("accepted_per_position", [])))
    elif accepted:
        out["draft_n_accepted"] = accepted
    if slot_stats is not None and slot_stats.get("context_drafted", 0):
        # drafts by source: the drafter's lattice and the context (a node both proposed counts for both)
        for key in ("lattice_drafted", "lattice_accepted", "context_drafted", "context_accepted", "propose_skipped"):
            out[key] = int(slot_stats[key])
    if clock.ledger0 is not None and ledger is not None:
        out["ledger"] = ledger_per_step(clock.ledger0, ledger)
    return out
