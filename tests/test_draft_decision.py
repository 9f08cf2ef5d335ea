"""The auto explanation: the native cost model's decision from given costs and acceptance, on both
sides of break-even, and the numbers it prints (checked against a float reference written here)."""

from __future__ import annotations

import pytest

from pydflash2.draft_decision import acceptance_estimate, decide, explain_run, explain_tree_auto

VERIFY = [0.010, 0.015, 0.020, 0.025]  # seconds for 1..4 rows: 4 rows cost 2.5x one
DRAFT = [0.001, 0.001, 0.001]


def reference_rates(verify: list[float], draft: list[float], acceptance: list[float]) -> list[float]:
    rates = []
    for n in range(len(draft) + 1):
        tau, reach = 1.0, 1.0
        for a in acceptance[:n]:
            reach *= a
            tau += reach
        rates.append(tau / (verify[n] + (draft[n - 1] if n else 0.0)))
    return rates


def test_weak_drafter_decodes_plainly_and_says_why() -> None:
    acceptance = [0.5, 0.5, 0.5]
    d = decide(VERIFY, DRAFT, acceptance)
    rates = reference_rates(VERIFY, DRAFT, acceptance)
    assert d.n == 0 == max(range(4), key=lambda n: rates[n])
    assert d.rate == pytest.approx(rates)
    assert d.break_even_tau[3] == pytest.approx((0.025 + 0.001) / 0.010)
    msg = d.message()
    assert msg.startswith("auto: plain decoding")
    assert "Verifying 4 rows costs 2.5x one row" in msg
    assert "3 drafts pay only above tau 2.60" in msg
    assert "(1 draft above 1.60)" in msg
    assert "estimate is tau 1.88 at 3 drafts (1.50 at 1)" in msg


def test_strong_drafter_drafts_and_states_the_gain() -> None:
    acceptance = [0.9, 0.9, 0.9]
    d = decide(VERIFY, DRAFT, acceptance)
    rates = reference_rates(VERIFY, DRAFT, acceptance)
    assert d.n == 3 == max(range(4), key=lambda n: rates[n])
    assert d.speedup == pytest.approx(rates[3] / rates[0])
    msg = d.message()
    assert "auto: 3 drafts per step" in msg
    assert "expected tau 3.44" in msg and "break-even of 2.60" in msg
    assert f"{rates[3] / rates[0]:.2f}x plain" in msg and "1.32x" in msg


def test_decision_moves_at_break_even() -> None:
    # one draft: tau 1 + a against break-even (0.015 + 0.001) / 0.010 = 1.6
    assert decide(VERIFY[:2], DRAFT[:1], [0.59]).n == 0
    assert decide(VERIFY[:2], DRAFT[:1], [0.61]).n == 1


def test_run_counts_use_the_engines_prior() -> None:
    assert acceptance_estimate([0, 10], [0, 8]) == [0.5, 9 / 12]
    stats = {"drafted_per_position": [40, 20, 10], "accepted_per_position": [38, 19, 9]}
    msg = explain_run({"verify_s": VERIFY, "draft_s": DRAFT}, stats)
    assert msg is not None and msg.startswith("auto: 3 drafts")
    assert explain_run(None, stats) is None


def test_bad_costs_are_an_error() -> None:
    with pytest.raises(ValueError, match="verify costs"):
        decide(VERIFY, DRAFT, [0.5, 0.5])
    with pytest.raises(ValueError, match="finite"):
        decide([0.01, float("nan")], [0.001], [0.5])
    with pytest.raises(ValueError, match="acceptances in"):
        decide([0.01, 0.02], [0.001], [1.5])


def test_tree_auto_explanation_names_the_choice() -> None:
    model = {"max_budget": 16, "tree_steps": 5, "probes": 2, "best_budget": 4, "tree_expected_tokens": 1.9,
             "tree_rate": 40.0, "chain_n": 0, "chain_expected_tokens": 1.0, "chain_rate": 50.0, "plain_rate": 50.0,
             "choice": "plain"}
    msg = explain_tree_auto({"tree_auto": model, "n_steps": 60, "n_tree_steps": 2})
    assert msg is not None and msg.startswith("auto tree: 2 of 60 steps verified a tree (up to 16 nodes; 2 probes")
    assert "a tree of 4 nodes at tau 1.90, 40.0 tok/s, against plain decoding" in msg and msg.endswith(
        "plain decoding next.")
    one = explain_tree_auto({"tree_auto": {**model, "probes": 1}, "n_steps": 60, "n_tree_steps": 1})
    assert one is not None and "(up to 16 nodes; 1 probe over the engine's life)" in one
    faster = {**model, "tree_rate": 80.0, "chain_n": 3, "chain_expected_tokens": 1.6, "chain_rate": 60.0,
              "choice": "tree"}
    msg = explain_tree_auto({"tree_auto": faster, "n_steps": 60, "n_tree_steps": 50})
    assert msg is not None and "the chain of 3 drafts at tau 1.60, 60.0 tok/s (plain 50.0 tok/s)" in msg
    assert msg.endswith("a tree next.")
    assert explain_tree_auto({"tree_auto": None, "n_steps": 1}) is None
