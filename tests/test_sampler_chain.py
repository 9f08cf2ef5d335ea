"""The sampler chain under speculation (issue 24): logit bias, penalties and grammar
(llama.cpp's own samplers, llama-cpp-python's order) and logprobs, on SmolLM2-135M
with the shipped DFlash2 drafter, so that drafts are both accepted and rejected.

Greedy output equals llama-cpp-python's plain greedy create_completion with the same
settings: bit-identical on a batch-invariant build, up to a near-tie elsewhere
(tests/lossless.py). Sampling follows llama-cpp-python's own sampling law (chi-square).
"""

from __future__ import annotations

import json
import os

import llama_cpp
import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf
from lossless import DELTA_SMOLLM2, check_greedy, plain_greedy_chain
from sampling_law import Chain, ExactLaw, SpeculatorDraws, TargetLogits, sequential_test

from pydflash2 import exactness
from pydflash2.models import default_drafter, default_target
from pydflash2.speculator import GenerationError, Speculator

PROMPTS = ["List three colors.", "Describe a cat in one sentence."]
N_TOKENS = 20

LIST_GRAMMAR = r'''root ::= "[" ws item ("," ws item)* "]"
item ::= "\"" [a-z ]+ "\""
ws ::= [ \n]*'''
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
          "required": ["name", "legs"]}

SETTINGS = {
    "grammar": dict(grammar=LIST_GRAMMAR),
    "json_schema": dict(grammar=json_schema_to_gbnf(json.dumps(SCHEMA))),
    "penalties": dict(repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6),
    # 28 (",") banned, 30 (".") pushed up: the text changes where plain decoding would have them
    "logit_bias": dict(logit_bias={28: -100.0, 30: 2.5}),
}


@pytest.fixture(scope="module")
def smollm2() -> tuple[llama_cpp.Llama, object]:
    try:
        target = default_target()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    draft = default_drafter()
    if draft is None:
        pytest.skip("the shipped drafter is missing")
    llm = llama_cpp.Llama(str(target), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    return llm, draft


@pytest.fixture(scope="module")
def prompts(smollm2) -> dict[str, list[int]]:
    llm, _ = smollm2
    with Speculator(llm, None, n_max=0) as spec:
        return {p: spec.tokenize_prompt(p) for p in PROMPTS}


def _completion_kwargs(settings: dict) -> dict:
    """The same settings in create_completion's words."""
    kw = {k: v for k, v in settings.items() if k != "grammar"}
    if "grammar" in settings:
        kw["grammar"] = llama_cpp.LlamaGrammar.from_string(settings["grammar"], verbose=False)
    return kw


@pytest.fixture(scope="module")
def speculators(smollm2):
    """One Speculator per n_max over the same Llama (each starts its requests afresh)."""
    llm, draft = smollm2
    specs: dict = {n: Speculator(llm, draft, n_max=n) for n in [1, 2, 3, 4, 5, 6, 7, "auto"]}
    # the greedy selector keeps to the grammar; Viterbi's path does not, so its forbidden drafts
    # reach verification, which must reject them
    specs["viterbi"] = Speculator(llm, draft, n_max=5, selector="viterbi")
    yield specs
    for spec in specs.values():
        spec.close()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_greedy_with_the_chain_is_plain_greedy(smollm2, prompts, speculators, name) -> None:
    llm, draft = smollm2
    settings = SETTINGS[name]
    plain = {}
    for p, ids in prompts.items():
        ref = llm.create_completion(ids, max_tokens=N_TOKENS, temperature=0.0, **_completion_kwargs(settings))
        run = plain_greedy_chain(llm, ids, N_TOKENS, **settings)
        # the margins' replica of the chain decodes what create_completion decodes
        assert llm.detokenize(run.tokens).decode("utf-8", "replace") == ref["choices"][0]["text"], (name, p)
        plain[p] = run
    invariant = exactness.llama_invariance(llm)
    exact = invariant.batch_invariant and invariant.max_batch is None
    drafted = accepted = 0
    for n_max, spec in speculators.items():
        for p in PROMPTS:
            out = spec.generate(p, max_tokens=N_TOKENS, **settings)
            check_greedy(out.tokens, plain[p], exact=exact, delta=DELTA_SMOLLM2, what=(name, n_max, p))
            drafted += sum(out.stats["drafted_per_position"])
            accepted += sum(out.stats["accepted_per_position"])
    print(f"{name}: drafts accepted {accepted} of {drafted} reached")
    assert 0 < accepted < drafted  # drafts were accepted and rejected
    if name == "json_schema":
        text = speculators[3].generate(PROMPTS[1], max_tokens=120, **settings).text
        if text.rstrip().endswith("}"):  # complete within the budget: valid against the schema
            assert set(json.loads(text)) >= {"name", "legs"}


SAMPLING = {
    # a raw prompt in the middle of a repetition: plain sampling repeats the first token, so the
    # penalties (which see the generated tokens only, as in llama-cpp-python) change tokens 2 and 3
    "penalties": ("ha ha ha ha ha ha ha ha", dict(repeat_penalty=1.5, frequency_penalty=1.0, presence_penalty=2.0)),
    "grammar": ("Name an animal.", dict(grammar=r'''root ::= ("The" | "A" | "My") " " [a-z]+ [a-z .,]*''')),
}


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampling_with_the_chain_follows_the_exact_law(smollm2, name) -> None:
    """The first 3 tokens (token 1 sampled at prefill, 2 and 3 by draft verification) at T=1, top-p
    0.9 with the chain, one-sample against the exact law (tests/sampling_law.py: the target's
    batch-1 logits through llama.cpp's own samplers), drawn until the same test rejects the chain
    without the penalties (resp. grammar): a verifier that skipped them would fail here."""
    if os.environ.get("PYDFLASH2_REQUIRE_SPECIAL_BUILD") == "1":
        pytest.skip("the sampling law does not depend on the build: the slow tier runs it")
    llm, draft = smollm2
    prompt, settings = SAMPLING[name]
    with Speculator(llm, None, n_max=0) as spec:
        ids = spec.tokenize_prompt(prompt, chat=name != "penalties")
    chain = Chain(temperature=1.0, top_p=0.9, **settings)
    without = Chain(temperature=1.0, top_p=0.9)
    logits = TargetLogits(llm.model_path, ids)
    true_law, wrong_law = ExactLaw(logits, chain), ExactLaw(logits, without)
    try:
        with Speculator(llm, draft, n_max=3) as spec:
            draws = SpeculatorDraws(spec, ids, chain, true_law.END, 3)
            sequential_test(draws, true_law, wrong_law, 3, chunk=100, what=name)
    finally:
        logits.close()
    print(f"{name}: drafts accepted {draws.accepted} of {draws.drafted} reached")
    assert 0 < draws.accepted < draws.drafted


def test_logprobs_equal_llama_cpp_python(smollm2, prompts) -> None:
    llm, draft = smollm2
    scorer = llama_cpp.Llama(llm.model_path, n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True,
                             verbose=False)
    invariant = exactness.llama_invariance(llm)
    exact = invariant.batch_invariant and invariant.max_batch is None
    # invariant build: the logits are bit-identical, the log-softmax differs only in float rounding
    # (numpy float32 vs our float64 sums); stock build: a verify batch moves a logit by up to 1.64
    # on SmolLM2 (tests/lossless.py), a log-softmax by up to twice that
    tol = 1e-4 if exact else 2 * 1.64
    worst = 0.0
    with Speculator(llm, draft, n_max=3) as spec:
        for p, ids in prompts.items():
            out = spec.generate(ids, max_tokens=16, logprobs=3)
            ref = scorer.create_completion(ids, max_tokens=16, temperature=0.0, logprobs=3)["choices"][0]
            assert out.logprobs is not None and len(out.logprobs) == len(out.tokens)
            ref_lp = ref["logprobs"]["token_logprobs"]
            same = min(len(out.tokens), len(ref_lp))
            if ref["text"] != out.text:  # stock build: compare up to where the texts part
                same = next((i for i, t in enumerate(ref["logprobs"]["tokens"][:same])
                             if scorer.detokenize([out.tokens[i]]).decode("utf-8", "replace") != t), same)
            assert same > 4
            for i in range(same):
                ours = out.logprobs[i]
                worst = max(worst, abs(ours.logprob - ref_lp[i]))
                assert ours.logprob == pytest.approx(ref_lp[i], abs=tol), (p, i)
                theirs = sorted(ref["logprobs"]["top_logprobs"][i].values(), reverse=True)[:3]
                assert [v for _, v in ours.top] == pytest.approx(theirs, abs=tol), (p, i)
                assert ours.top[0][1] >= ours.logprob
            assert any(lp.logprob < -1e-3 for lp in out.logprobs)  # never all zero
            assert out.stats["n_spec_steps"] > 0
    print(f"logprobs: largest difference to llama-cpp-python {worst:.3g} (exact build: {exact})")
    scorer.close()


@pytest.mark.parametrize("kwargs, match, error", [
    (dict(grammar="root ::= undefined-rule"), "grammar", GenerationError),
    (dict(grammar="not gbnf at all"), "grammar", GenerationError),
    (dict(logit_bias={10**6: 1.0}), "logit_bias", GenerationError),
    (dict(logit_bias={5: float("nan")}), "logit_bias", GenerationError),
    (dict(repeat_penalty=0.0), "repeat_penalty", GenerationError),
    # out of an integer parameter's range: the Python API's one range check (pydflash2.sampling)
    (dict(repeat_last_n=-5), "repeat_last_n", ValueError),
    (dict(frequency_penalty=float("inf")), "penalty", GenerationError),
])
def test_bad_chain_parameters_are_errors(smollm2, kwargs, match, error) -> None:
    llm, draft = smollm2
    with Speculator(llm, draft, n_max=2) as spec:
        with pytest.raises(error, match=match):
            spec.generate("Hello", max_tokens=4, **kwargs)
        with pytest.raises(ValueError, match="logprobs"):
            spec.generate("Hello", max_tokens=4, logprobs=21)
        assert spec.generate("Hello", max_tokens=4).finish_reason == "length"  # still usable


def test_server_engine_takes_the_same_chain(smollm2, prompts) -> None:
    """The server's engine binding: two slots in one batch, one with a grammar, penalties and
    logprobs, one plain; each equals plain greedy decoding with its own settings."""
    from pydflash2.server.engine import BatchEngine

    llm, draft = smollm2
    settings = dict(grammar=LIST_GRAMMAR, repeat_penalty=1.2, logit_bias={30: 1.5})
    ids = prompts[PROMPTS[0]]
    plain_chain = plain_greedy_chain(llm, ids, N_TOKENS, **settings)
    plain = plain_greedy_chain(llm, ids, N_TOKENS)
    # flash attention as the reference Llama has it (off): llama.cpp's "auto" turns it on for the
    # engine's own context, and its summation order differs from the reference's in the last bits
    engine = BatchEngine(llm.model_path, draft, n_slots=2, n_ctx=256, n_threads=1, n_max=3, flash_attn=False)
    try:
        engine.start(0, ids, max_tokens=N_TOKENS, logprobs=2, **settings)
        engine.start(1, ids, max_tokens=N_TOKENS)
        got: dict[int, list[int]] = {0: [], 1: []}
        lps: list = []
        while any(len(got[s]) < N_TOKENS for s in got):
            for slot, committed in enumerate(engine.step()):
                assert committed is not None
                if slot == 0:
                    lps += engine.logprobs(0, committed)
                got[slot] += committed
    finally:
        engine.close()
    invariant = exactness.llama_invariance(llm)
    exact = invariant.batch_invariant and invariant.max_batch is None
    for slot, ref in ((0, plain_chain), (1, plain)):
        eog = next((i for i, t in enumerate(got[slot]) if llama_cpp.llama_vocab_is_eog(
            llama_cpp.llama_model_get_vocab(llm._model.model), t)), None)
        check_greedy(got[slot][:eog][:N_TOKENS], ref, exact=exact, delta=DELTA_SMOLLM2, what=slot)
    assert len(lps) == len(got[0]) and all(len(lp.top) == 2 for lp in lps)
    assert [lp.token for lp in lps] == got[0]
