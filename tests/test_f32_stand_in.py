"""The F32 stand-in for a fast device (issue 57): the default target requantized to F32 at test time
(pydflash2_testing.f32_target), where reading the weights bounds a CPU decode, so a verify of 8 rows
costs about 1.8 plain steps, as on a GPU (benchmarks/speculation_tax.py --f32 measures it). The shipped
drafter reads its hidden states as it reads the Q4_1 original's: speculation on it is lossless and
the drafts are accepted as they are there."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import llama_cpp
import pydflash2_testing as testing
import pytest
from lossless import DELTA_SMOLLM2, check_greedy, plain_greedy

from pydflash2 import Speculator
from pydflash2.models import default_drafter

pytestmark = pytest.mark.slow  # SmolLM2 at 540 MB

AGENTIC = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts_agentic_eval.jsonl"


@pytest.fixture(scope="module")
def f32_llm(tmp_path_factory: pytest.TempPathFactory) -> llama_cpp.Llama:
    try:
        source = testing.default_target()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    target = testing.f32_target(source, tmp_path_factory.mktemp("f32") / "smollm2.F32.gguf")
    # every matrix F32 (norms were already): nothing left quantized to make the decode compute-bound
    types = {t.tensor_type for t in gguf.GGUFReader(target).tensors}
    assert types == {gguf.GGMLQuantizationType.F32}, types
    return llama_cpp.Llama(str(target), n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)


def chain_tau(llm: llama_cpp.Llama, drafter: Path, prompts: list[list[int]], plain: list | None = None) -> float:
    """tau of the chain of 7 over the prompts (24 tokens each); greedy checked against plain where given."""
    steps = generated = 0
    with Speculator(llm, str(drafter), n_max=7) as spec:
        for i, ids in enumerate(prompts):
            out = spec.generate(ids, max_tokens=24)
            if plain is not None:
                check_greedy(out.tokens, plain[i], exact=out.stats["exact"], delta=DELTA_SMOLLM2, what=("f32", i))
            steps += out.stats["n_steps"]
            generated += out.stats["n_generated"] - 1
    return generated / steps


def test_the_shipped_drafter_speculates_on_the_f32_stand_in(f32_llm) -> None:
    drafter = default_drafter()
    if drafter is None:
        pytest.skip("this install lacks the shipped drafter")
    tasks = [json.loads(line)["messages"] for line in AGENTIC.read_text().splitlines() if line.strip()][::16][:2]
    with Speculator(f32_llm, None, n_max=0) as spec:
        prompts = [spec.tokenize_prompt(m) for m in tasks]
    plain = [plain_greedy(f32_llm, ids, 24) for ids in prompts]
    tau = chain_tau(f32_llm, drafter, prompts, plain)
    original = llama_cpp.Llama(str(testing.default_target()), n_ctx=2048, n_threads=2, n_threads_batch=2,
                               verbose=False)
    tau_q4 = chain_tau(original, drafter, prompts)
    original.close()
    print(f"chain 7, 2 agentic tasks, 24 tokens: tau {tau:.2f} on the F32 stand-in, {tau_q4:.2f} on the Q4_1 original")
    assert tau > 1.05  # drafts are accepted (a drafter that reads noise stays at 1.0)
    assert tau >= 0.8 * tau_q4  # as they are on the target the drafter was trained on
