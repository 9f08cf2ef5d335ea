"""Sampling follows the target's law after its whole sampler chain: the chain (plain, with
top-k/top-p/min-p, grammar, logit bias) and the tree, on the hot-token tiny target with a random
DFlash2 drafter (drafts it accepts often, and rejects often). Seconds, where the SmolLM2
two-sample tests (tests/test_sampler_chain.py, tests/test_tree_verify.py: the slow tier) take minutes.

Each test is a one-sample chi-square test of the first N_STEPS tokens (token 1 sampled at
prefill, the rest by draft verification) against the exact law computed from the target's
logits through llama.cpp's own samplers (tests/sampling_law.py), drawn until the same test
rejects a deliberately wrong law at p < 0.001; any drawn token the exact law forbids fails it.
What it can tell depends on the target: after its first token this one is nearly deterministic
(one conditional has the draws for a chi-square), so later steps are checked by that
forbidden-token rule (grammar, filters, bias), and the distributional claim at those steps stays
with the SmolLM2 tests. Penalties act only from the second token on, so they are not here either
(the SmolLM2 test of the slow tier holds them).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pydflash2_testing as testing
import pytest
from sampling_law import Chain, ExactLaw, SpeculatorDraws, TargetLogits, sequential_test

from pydflash2.speculator import Speculator, load_target

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))  # " t", "he", " a", " the", " w", "es"
SPEC = testing.TargetSpec(hot_tokens=HOT)  # the hot-token target of test_speculator.py
ES, W = HOT[5], HOT[4]  # its two favourite tokens after PROMPT (p ~ 0.63 and 0.21)
PROMPT = "Once upon a time"
N_STEPS = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("law")
    target = testing.make_target_gguf(d / "target.gguf", SPEC)
    v2 = testing.make_drafter_checkpoint(d / "v2-hf", target, testing.DrafterSpec(version=2))
    return {"target": target, "v2": testing.checkpoint_to_gguf(v2, target, d / "v2.gguf")}


@pytest.fixture(scope="module")
def chain_llm(models) -> llama_cpp.Llama:
    llm, _ = load_target(models["target"], n_ctx=256, n_threads=1)
    return llm


@pytest.fixture(scope="module")
def tree_llm(models) -> llama_cpp.Llama:
    llm, _ = load_target(models["target"], n_ctx=256, n_threads=1, tree_budget=8)
    return llm


def _run(spec: Speculator, chain: Chain, wrong: Chain, what: str, *, flash_attn: bool = False,
         prompt: str = PROMPT) -> None:
    ids = spec.tokenize_prompt(prompt, chat=False)
    logits = TargetLogits(str(spec.llm.model_path), ids, flash_attn=flash_attn)
    true_law, wrong_law = ExactLaw(logits, chain), ExactLaw(logits, wrong)
    draw = SpeculatorDraws(spec, ids, chain, true_law.END, N_STEPS)
    try:
        draws = sequential_test(draw, true_law, wrong_law, N_STEPS, what=what)
    finally:
        logits.close()
    print(f"{what}: drafts accepted {draw.accepted} of {draw.drafted} reached")
    # drafts were accepted and rejected often enough for a biased verifier to show in the counts
    assert len(draws) // 4 < draw.accepted < draw.drafted, (draw.accepted, draw.drafted, len(draws))


CHAIN_CASES = {
    # (the chain, a wrong law the test must tell apart)
    "T=1": (Chain(temperature=1.0), Chain(temperature=0.85)),
    # the filters run before the temperature, as in llama.cpp: the wrong law runs it first
    "filters": (Chain(temperature=1.5, top_k=5, top_p=0.9, min_p=0.02),
                Chain(temperature=1.5, top_k=5, top_p=0.9, min_p=0.02, temperature_first=True)),
    # the first character may not be an "e": the favourite "es" is forbidden there, then lower case
    "grammar": (Chain(grammar=r'root ::= [ a-df-z] [a-z ]*'), Chain()),
    "logit_bias": (Chain(logit_bias={ES: -100.0, W: 1.0}), Chain()),
}


@pytest.mark.parametrize("name", list(CHAIN_CASES))
def test_chain_sampling_follows_the_exact_law(models, chain_llm, name) -> None:
    chain, wrong = CHAIN_CASES[name]
    with Speculator(chain_llm, models["v2"], n_max=4, selector="sample") as spec:
        _run(spec, chain, wrong, f"chain {name}")


@pytest.mark.parametrize("chain, wrong", [
    (Chain(temperature=1.0), Chain(temperature=0.85)),
    (Chain(temperature=0.7, top_p=0.9), Chain(temperature=0.85, top_p=0.9)),
])
def test_tree_sampling_follows_the_exact_law(models, tree_llm, chain, wrong) -> None:
    """The tokens a tree verify commits (9 rows: the root and 8 drafted nodes)."""
    with Speculator(tree_llm, models["v2"], n_max=7, tree_budget=8) as spec:
        assert spec.tree_budget == 8
        _run(spec, chain, wrong, f"tree T={chain.temperature} top_p={chain.top_p}", flash_attn=True)
