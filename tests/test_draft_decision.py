"""The explanation words what the engine ran (its stats' "plans") and decides nothing itself: the
plan it names is the one with most steps, with the taus the engine recorded for it. (A run of
generate against the engine's own histogram: tests/test_cli.py.)"""

from __future__ import annotations

import pytest

from pydflash2.draft_decision import block_positions, expected_tokens, explain_run, explain_tree_auto, merge_plans

PLANS = [
    {"plan": "plain", "steps": 45, "expected_tau": 1.0, "tau": 1.0},
    {"plan": "chain of 1", "steps": 15, "expected_tau": 1.5, "tau": 1.0667},
]


def test_names_the_plan_run_most_with_its_taus() -> None:
    msg = explain_run({"plans": PLANS})
    assert msg is not None
    assert msg.startswith("auto: the engine ran plain decoding in 45 of 60 steps (expected tau 1.00, measured 1.00)")
    assert "then a chain of 1 draft in 15 (expected tau 1.50, measured 1.07)" in msg
    # the order of the record does not matter, the steps do
    flipped = [{**PLANS[0], "steps": 10}, PLANS[1]]
    msg = explain_run({"plans": flipped})
    assert msg is not None and msg.startswith("auto: the engine ran a chain of 1 draft in 15 of 25 steps")


def test_names_trees_and_merged_plans() -> None:
    plans = [{"plan": "tree of 16", "steps": 3, "expected_tau": 2.5, "tau": 2.0},
             {"plan": "merged tree", "steps": 9, "expected_tau": 3.0, "tau": 3.5},
             {"plan": "candidates' tree", "steps": 1, "expected_tau": 2.0, "tau": 1.0}]
    msg = explain_run({"plans": plans})
    assert msg is not None and msg.startswith("auto: the engine ran the drafter's and the context's merged tree in 9")
    assert "a tree of 16 nodes in 3" in msg and "the context's tree alone (no propose) in 1" in msg
    assert explain_run({"plans": []}) is None and explain_run({}) is None


def test_merged_runs_weigh_taus_by_steps() -> None:
    a = [{"plan": "chain of 3", "steps": 10, "expected_tau": 2.0, "tau": 3.0}]
    b = [{"plan": "chain of 3", "steps": 30, "expected_tau": 3.0, "tau": 1.0},
         {"plan": "plain", "steps": 5, "expected_tau": 1.0, "tau": 1.0}]
    m = merge_plans([a, b])
    assert [p["plan"] for p in m] == ["chain of 3", "plain"]
    assert m[0]["steps"] == 40
    assert m[0]["expected_tau"] == pytest.approx((10 * 2.0 + 30 * 3.0) / 40)
    assert m[0]["tau"] == pytest.approx((10 * 3.0 + 30 * 1.0) / 40)


def test_names_the_rates_the_engine_priced_the_plan_at() -> None:
    # where the engine ran the plan as its cost model chose it, the rates of that decision
    plans = [{**PLANS[0], "priced_steps": 40, "expected_rate": 20.0, "plain_rate": 20.0},
             {**PLANS[1], "priced_steps": 0, "expected_rate": 0.0, "plain_rate": 0.0}]
    msg = explain_run({"plans": plans})
    assert msg is not None
    assert msg.startswith("auto: the engine ran plain decoding in 45 of 60 steps (expected tau 1.00, "
                          "measured 1.00), priced at 20.0 tok/s;")
    chain = [{**PLANS[1], "steps": 50, "priced_steps": 50, "expected_rate": 24.5, "plain_rate": 20.3}]
    msg = explain_run({"plans": chain})
    assert msg is not None and msg.endswith("priced at 24.5 tok/s against plain decoding's 20.3.")
    m = merge_plans([chain, [{**chain[0], "priced_steps": 25, "expected_rate": 30.5, "plain_rate": 20.3}]])
    assert m[0]["priced_steps"] == 75 and m[0]["expected_rate"] == pytest.approx((50 * 24.5 + 25 * 30.5) / 75)


def test_acceptance_columns_are_the_blocks_positions() -> None:
    # an 8-row block (7 drafts) whose stats are as wide as a context path (32): 7 columns
    stats = {"max_draft": 7, "drafted_per_position": [5, 4, 3, 0, 0, 0, 0] + [0] * 25}
    assert block_positions(stats) == 7
    # a context path that went deeper than the block shows as far as it went
    stats["drafted_per_position"][10] = 1
    assert block_positions(stats) == 11


def test_expected_tokens_is_the_chains_formula() -> None:
    assert expected_tokens([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    with pytest.raises(ValueError, match="acceptances"):
        expected_tokens([1.5])


def test_tree_auto_explanation_names_the_choice() -> None:
    model = {"max_budget": 16, "tree_steps": 5, "probes": 2, "best_budget": 4, "tree_expected_tokens": 1.9,
             "tree_rate": 40.0, "chain_n": 0, "chain_expected_tokens": 1.0, "chain_rate": 50.0, "plain_rate": 50.0,
             "choice": "plain"}
    msg = explain_tree_auto({"tree_auto": model, "n_steps": 60, "n_tree_steps": 2})
    assert msg is not None and msg.startswith("auto tree: 2 of 60 steps verified a tree (up to 16 nodes; 2 probes")
    assert "a tree of 4 nodes at tau 1.90, 40.0 tok/s, against plain decoding" in msg and msg.endswith(
        "it chose plain decoding.")
    one = explain_tree_auto({"tree_auto": {**model, "probes": 1}, "n_steps": 60, "n_tree_steps": 1})
    assert one is not None and "(up to 16 nodes; 1 probe over the engine's life)" in one
    faster = {**model, "tree_rate": 80.0, "chain_n": 3, "chain_expected_tokens": 1.6, "chain_rate": 60.0,
              "choice": "tree"}
    msg = explain_tree_auto({"tree_auto": faster, "n_steps": 60, "n_tree_steps": 50})
    assert msg is not None and "the chain of 3 drafts at tau 1.60, 60.0 tok/s (plain 50.0 tok/s)" in msg
    assert msg.endswith("it chose a tree.")
    assert explain_tree_auto({"tree_auto": None, "n_steps": 1}) is None
