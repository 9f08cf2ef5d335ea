"""The draft-verify loop end to end: lossless against plain llama.cpp decoding,
stop handling, and clean failures. Targets and drafters are tiny real models."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import llama_cpp
import pydflash2_testing as testing
import pytest
from lossless import PlainRun, check_greedy, chi_square_p
from lossless import plain_greedy as plain_run
from pydflash2.convert.cli import main as convert_main

from pydflash2 import draft_costs, exactness
from pydflash2._engine import greedy_is_exact
from pydflash2.speculator import Completion, GenerationError, Speculator, with_lazy_head

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))

PROMPTS = [
    "Once upon a time", "The answer is", "def main():", "Hello", "A small drafter", "Water boils at",
    "The capital of France", "It learned to guess", "quick brown", "Speculative decoding drafts",
    "print('hello world')", "and when it guessed right", "The target model verifies", "everyone was happy",
    "100 degrees", "lazy dog", "a block of tokens", "the longest correct prefix", "Paris", "42",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spec")
    target = testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=HOT))
    v2 = testing.make_drafter_checkpoint(d / "v2-hf", target, testing.DrafterSpec(version=2))
    v1 = testing.make_drafter_checkpoint(d / "v1-hf", target, testing.DrafterSpec(version=1, seed=7))
    assert convert_main([str(v2), "--target", str(target), "-o", str(d / "v2-converted.gguf"), "--outtype", "f16"]) == 0
    return {
        "target": target,
        "v2": testing.checkpoint_to_gguf(v2, target, d / "v2.gguf"),
        "v1": testing.checkpoint_to_gguf(v1, target, d / "v1.gguf"),
        "v2_converted": d / "v2-converted.gguf",
    }


@pytest.fixture(scope="module")
def llm(models) -> llama_cpp.Llama:
    """With the lazy LM head, as load_target makes targets: every test here runs it."""
    return with_lazy_head(llama_cpp.Llama(str(models["target"]), n_ctx=512, n_batch=512, verbose=False))


@pytest.fixture(scope="module")
def plain(llm) -> dict[str, PlainRun]:
    """Plain greedy runs with their top-2 margins (tests/lossless.py)."""
    return {p: plain_run(llm, llm.tokenize(p.encode(), add_bos=True, special=True), 24) for p in PROMPTS}


@pytest.fixture(scope="module")
def references(plain) -> dict[str, list[int]]:
    return {p: run.tokens for p, run in plain.items()}


@pytest.fixture(scope="module")
def exact(llm) -> bool:
    """Batch-invariant target here: output must equal plain decoding exactly;
    else it may leave it at a near-tie (tests/lossless.py)."""
    inv = exactness.llama_invariance(llm)
    return inv.batch_invariant and inv.max_batch is None  # f32 weights: no batch-size kernel switch


@pytest.mark.parametrize("drafter, selector", [("v2", "greedy"), ("v1", "greedy"), ("v2_converted", "greedy"),
                                                ("v2", "viterbi")])
def test_greedy_is_lossless(models, llm, plain, exact, drafter, selector) -> None:
    accepted = 0
    for n_max in [1, 2, 3, 4, 5, 6, 7, "auto"]:
        with Speculator(llm, models[drafter], n_max=n_max, selector=selector) as spec:
            for prompt in PROMPTS:
                out = spec.generate(prompt, max_tokens=24, chat=False)
                check_greedy(out.tokens, plain[prompt], exact=exact, what=(drafter, n_max, prompt))
                assert out.stats["exact"] is exact
                accepted += sum(out.stats["accepted_per_position"])
    # the hot-token target makes the random drafter right now and then: acceptance is exercised
    assert accepted > 20


def test_plain_decoding_through_the_engine(models, llm, references) -> None:
    with Speculator(llm, None, n_max=0) as spec:
        for prompt in PROMPTS[:5]:
            out = spec.generate(prompt, max_tokens=24, chat=False)
            assert out.tokens == references[prompt]
            assert out.stats["n_spec_steps"] == 0


def test_target_given_as_path(models, plain, exact) -> None:
    with Speculator(str(models["target"]), models["v2"], n_ctx=256, n_max=3) as spec:
        out = spec.generate(PROMPTS[0], max_tokens=24, chat=False)
    check_greedy(out.tokens, plain[PROMPTS[0]], exact=exact)


def test_llama_object_is_reused_and_stays_usable(models, llm, plain, exact) -> None:
    before = llm(PROMPTS[1], max_tokens=10, temperature=0.0)["choices"][0]["text"]
    with Speculator(llm, models["v2"], n_max=4) as spec:
        assert spec.llm is llm
        out = spec.generate(PROMPTS[1], max_tokens=10, chat=False)
    check_greedy(out.tokens, PlainRun(plain[PROMPTS[1]].tokens[:10], plain[PROMPTS[1]].margins), exact=exact)
    after = llm(PROMPTS[1], max_tokens=10, temperature=0.0)["choices"][0]["text"]
    assert after == before


def _first_tokens(sample, n_runs: int) -> list[tuple[int, int]]:
    return [tuple(sample(seed)[1:3]) for seed in range(n_runs)]


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        # the filters run before the temperature, as in llama.cpp: order matters and is checked here
        dict(temperature=1.5, top_k=5, top_p=0.9, min_p=0.02),
    ],
)
def test_sampling_follows_the_target_distribution(models, llm, params) -> None:
    # Tokens 2 and 3 come out of draft verification (token 1 is sampled at prefill).
    prompt = "Once upon a time"
    n_runs = 1200
    ptoks = llm.tokenize(prompt.encode(), add_bos=True, special=True)

    def plain(seed: int) -> list[int]:
        llm.set_seed(seed)
        out = []
        for tok in llm.generate(ptoks, temp=params["temperature"], top_k=params["top_k"], top_p=params["top_p"],
                                min_p=params["min_p"], reset=True):
            out.append(tok)
            if len(out) == 3:
                return out
        return out

    accepted = 0

    def speculative(seed: int) -> list[int]:
        nonlocal accepted
        out = spec.generate(prompt, max_tokens=3, chat=False, seed=seed, **params)
        accepted += sum(out.stats["accepted_per_position"])
        return out.tokens

    with Speculator(llm, models["v2"], n_max=4, selector="sample") as spec:
        spec_runs = _first_tokens(speculative, n_runs)
    plain_runs = _first_tokens(plain, n_runs)

    for pos in (0, 1):
        p_value = chi_square_p(spec_runs, plain_runs, pos)
        assert p_value > 0.001, (pos, p_value)
    # drafts were accepted often enough for a biased verifier to show in the counts
    assert accepted > n_runs // 4, accepted


def test_sampling_is_reproducible(models, llm) -> None:
    with Speculator(llm, models["v2"], n_max=3) as spec:
        a = spec.generate("Hello", max_tokens=20, chat=False, temperature=0.9, seed=123, top_k=40)
        b = spec.generate("Hello", max_tokens=20, chat=False, temperature=0.9, seed=123, top_k=40)
    assert a.tokens == b.tokens


def test_stop_string_split_across_tokens(models, llm) -> None:
    with Speculator(llm, models["v2"], n_max=5) as spec:
        # the same configuration without a stop string is the reference (deterministic)
        full = spec.generate(PROMPTS[0], max_tokens=24, chat=False).tokens
        ref_text = llm.detokenize(full).decode("utf-8", "replace")
        # a stop string that starts inside one token and ends in the next
        pieces = [llm.detokenize([t]).decode("utf-8", "replace") for t in full]
        start = len(pieces[0]) + len(pieces[1]) - 1
        stop = ref_text[start : start + 3]
        assert stop and len(pieces[1]) >= 1
        streamed = "".join(spec.stream(PROMPTS[0], max_tokens=24, chat=False, stop=[stop]))
        out = spec.last
    assert out is not None and out.finish_reason == "stop"
    assert out.text == streamed == ref_text[: ref_text.index(stop)]
    assert stop not in out.text


def test_max_tokens(models, llm) -> None:
    with Speculator(llm, models["v2"], n_max=7) as spec:
        for n in (1, 2, 5, 9):
            out = spec.generate("Hello", max_tokens=n, chat=False)
            assert out.finish_reason == "length" and len(out.tokens) == n


def test_no_draft_is_verified_past_max_tokens(models, llm, plain, exact) -> None:
    """Near max_tokens a step drafts only what can still be kept (as upstream caps
    its drafts): the verify rows of a request never pass its last token."""
    with Speculator(llm, models["v2"], n_max=7) as spec:
        for n in (1, 2, 5, 9, 24):
            out = spec.generate("Hello", max_tokens=n, chat=False)
            check_greedy(out.tokens, dataclasses.replace(plain["Hello"], tokens=plain["Hello"].tokens[:n]),
                         exact=exact, what=n)
            # the target committed exactly the tokens asked for: no step overshot max_tokens
            # (uncapped, a last step that accepts more drafts than are wanted commits them)
            assert out.stats["n_generated"] == n, (n, out.stats["n_max_histogram"])
            hist = out.stats["n_max_histogram"]
            assert all(count == 0 for count in hist[max(0, n - 1):]), (n, hist)  # no draft of n-1 or more


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_lazy_head_runs_the_head_once_per_committed_token(models, llm, plain, exact, temperature) -> None:
    """The verify decode stops before the LM head; the head then runs for the rows
    the verify reads: one per committed token (a rejected block's later rows get
    none). Output equals the run that computes every row's logits (on a
    batch-invariant target; elsewhere greedy output is checked against plain
    decoding as everywhere). One row per product (where reading the head's weight bounds it the
    engine may compute rows in groups of 8: tests/test_context_drafts.py)."""
    rows = full_rows = 0
    with (Speculator(llm, models["v2"], n_max=5) as lazy,
          Speculator(llm, models["v2"], n_max=5, lazy_head=False) as full):
        assert lazy.lazy_head and not full.lazy_head
        lazy._native.set_lazy_head_group(1)
        for i, prompt in enumerate(PROMPTS[:8]):
            a = lazy.generate(prompt, max_tokens=24, chat=False, temperature=temperature, seed=i)
            b = full.generate(prompt, max_tokens=24, chat=False, temperature=temperature, seed=i)
            if exact:
                assert a.tokens == b.tokens, prompt
            elif temperature == 0.0:
                check_greedy(a.tokens, dataclasses.replace(plain[prompt], tokens=plain[prompt].tokens[:24]),
                             exact=False, what=prompt)
            st = a.stats
            assert st["lazy_head"] is True and b.stats["lazy_head"] is False
            # steps that drafted nothing (the last one, capped by max_tokens) decode one row the usual way
            spec_tokens = st["n_generated"] - 1 - st["n_max_histogram"][0]
            assert st["lazy_head_rows"] == spec_tokens, (prompt, st["lazy_head_rows"], spec_tokens)
            rows += st["lazy_head_rows"]
            full_rows += sum((d + 1) * c for d, c in enumerate(st["n_max_histogram"]) if d > 0)
            assert b.stats["lazy_head_rows"] == 0
    assert rows < full_rows  # blocks were rejected: the head ran for fewer rows than were verified


def test_eos_ends_generation(tmp_path) -> None:
    target = testing.make_target_gguf(tmp_path / "t.gguf", testing.TargetSpec(hot_tokens=(testing.EOS_ID, *HOT[:2])))
    ck = testing.make_drafter_checkpoint(tmp_path / "d", target)
    draft = testing.checkpoint_to_gguf(ck, target, tmp_path / "d.gguf")
    llm = llama_cpp.Llama(str(target), n_ctx=256, verbose=False)
    finishes = []
    with Speculator(llm, draft, n_max=3) as spec:
        for prompt in PROMPTS:
            out = spec.generate(prompt, max_tokens=64, chat=False)
            finishes.append(out.finish_reason)
            if out.finish_reason == "eos":
                assert testing.EOS_ID not in out.tokens
                ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
                check_greedy(out.tokens, plain_run(llm, ids, 64), exact=exactness.llama_invariance(llm).batch_invariant)
    assert "eos" in finishes


def test_full_context_finishes_cleanly(models) -> None:
    llm = llama_cpp.Llama(str(models["target"]), n_ctx=48, verbose=False)
    with Speculator(llm, models["v2"], n_max=7) as spec:
        prompt = llm.tokenize(b"Once upon a time", add_bos=True, special=True)
        out = spec.generate(prompt, max_tokens=500)
        assert out.finish_reason == "context"
        # llama.cpp may round the context up; the last token is emitted but never decoded
        assert len(prompt) + len(out.tokens) == llm.n_ctx() + 1
        # still usable afterwards
        again = spec.generate(prompt, max_tokens=5)
        assert again.tokens == out.tokens[:5]


def test_cancelled_stream_leaves_the_engine_reusable(models, llm, plain, exact) -> None:
    with Speculator(llm, models["v2"], n_max=4) as spec:
        gen = spec.stream(PROMPTS[2], max_tokens=24, chat=False)
        next(gen)
        gen.close()
        out = spec.generate(PROMPTS[3], max_tokens=24, chat=False)
    check_greedy(out.tokens, plain[PROMPTS[3]], exact=exact)


def test_chat_prompt_uses_the_template(models, llm) -> None:
    with Speculator(llm, models["v2"], n_max=2) as spec:
        ids = spec.tokenize_prompt("hi", chat=True)
        text = llm.detokenize(ids, special=True).decode()
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        out = spec.generate([{"role": "user", "content": "hi"}], max_tokens=4)
        assert isinstance(out, Completion) and len(out.tokens) <= 4


def test_stats_are_reported(models, llm) -> None:
    with Speculator(llm, models["v2"], n_max=3) as spec:
        out = spec.generate("Hello", max_tokens=20, chat=False)
    s = out.stats
    for key in ("tau", "n_max", "tokens_per_second", "ttft_s", "draft_s", "verify_s", "inject_s",
                "drafted_per_position", "accepted_per_position"):
        assert key in s
    assert len(s["drafted_per_position"]) == 3
    assert s["tau"] == pytest.approx((len(out.tokens) - 1) / s["n_steps"])
    assert all(a <= d for a, d in zip(s["accepted_per_position"], s["drafted_per_position"], strict=True))
    assert s["capture_path"] == "tap"  # a llama target: llama.cpp's layer-input taps


def test_speculators_sharing_a_context_each_get_their_own_taps(models, llm, tmp_path) -> None:
    """A request leaves the taps set when the same engine set them last (each set makes llama.cpp
    reserve its scheduler), and sets them again when another engine on the context set them since:
    two drafters tapping different layers, their requests interleaved, draft exactly as each alone."""
    other = testing.checkpoint_to_gguf(
        testing.make_drafter_checkpoint(tmp_path / "hf", models["target"],
                                        testing.DrafterSpec(target_layer_ids=(1,), seed=5)),
        models["target"], tmp_path / "other.gguf")
    prompts = ["Once upon a time", "The answer is"]

    def run(spec: Speculator, prompt: str) -> tuple[list[int], list[int]]:
        out = spec.generate(prompt, max_tokens=16, chat=False)
        return out.tokens, out.stats["accepted_per_position"]

    with Speculator(llm, models["v2"], n_max=3) as a:
        alone_a = [run(a, p) for p in prompts]
    with Speculator(llm, str(other), n_max=3) as b:
        alone_b = [run(b, p) for p in prompts]
    with Speculator(llm, models["v2"], n_max=3) as a, Speculator(llm, str(other), n_max=3) as b:
        for i, p in enumerate(prompts):
            assert run(a, p) == alone_a[i], p
            assert run(b, p) == alone_b[i], p
            assert run(a, p) == alone_a[i], p  # after b: a's layers set again


def test_engine_stats_time_the_decodes_by_rows(models, llm) -> None:
    """The verify and plain decodes as they ran, by rows (what benchmarks/speculation_tax.py holds the
    cost model's table against): one count per decode after the prompt, its rows, its seconds; with a
    drafter fed by every step, all of them fed."""
    with Speculator(llm, models["v2"], n_max=3) as spec:
        out = spec.generate("Once upon a time", max_tokens=24, chat=False)
        e = spec.engine_stats()
    counts, seconds = e["decodes_by_rows"], e["decode_s_by_rows"]
    assert sum(counts) == out.stats["n_steps"] > 0  # one request: every decode after its prompt
    assert sum((i + 1) * n for i, n in enumerate(counts)) == out.stats["phases"]["rows"] - out.stats["n_prompt"]
    assert counts[3] > 0  # 3 drafts and the anchor
    assert all((n > 0) == (t > 0) for n, t in zip(counts, seconds, strict=True))
    assert e["fed_decodes_by_rows"] == counts and e["fed_decode_s_by_rows"] == seconds


# the step ledger's parts (native step_ledger.h), and the Python side
LEDGER = ("plan_s", "offers_s", "propose_s", "graph_setup_s", "select_s", "build_s", "decode_s", "sync_s", "head_s",
          "verify_s", "kv_s", "features_s", "inject_s", "sources_s", "prefill_s", "other_s")
PHASES = (*LEDGER, "python_s")


@pytest.mark.parametrize("n_max, temperature", [(3, 0.0), (3, 0.8), (0, 0.0)])
def test_phase_breakdown_partitions_the_request(models, llm, n_max, temperature) -> None:
    with Speculator(llm, models["v2"], n_max=n_max) as spec:
        spec.generate("Hello", max_tokens=8, chat=False)  # graphs built once, as in any later request
        out = spec.generate("Once upon a time", max_tokens=40, chat=False, temperature=temperature, seed=3)
    s = out.stats
    p = s["phases"]
    assert set(p) == {"n_steps", "rows", *PHASES}
    assert p["n_steps"] == s["n_steps"] > 0 and p["rows"] >= p["n_steps"]
    assert all(p[k] >= 0.0 for k in PHASES), p
    total = sum(p[k] for k in PHASES)
    # measured separately, the phases fit inside the request's wall time and cover most of it
    assert total <= s["total_s"] + 1e-6, (total, s["total_s"])
    assert total >= 0.8 * s["total_s"], (total, s["total_s"], p)
    # the ledger's parts are the engine's steps, timed from outside (the native calls) within 5%
    ledger = sum(p[k] for k in LEDGER)
    assert ledger == pytest.approx(s["engine_step_s"], rel=0.05), (ledger, s["engine_step_s"], p)
    assert p["decode_s"] > 0 and p["prefill_s"] > 0 and p["verify_s"] > 0
    if n_max == 0:
        assert p["propose_s"] == p["select_s"] == p["inject_s"] == p["graph_setup_s"] == p["features_s"] == 0.0
    else:
        assert p["propose_s"] > 0 and p["features_s"] > 0
        # the older draft/verify totals are sums of parts
        assert s["draft_s"] >= p["propose_s"] + p["select_s"] - 1e-9
        assert s["verify_s"] == pytest.approx(p["decode_s"] + p["sync_s"] + p["head_s"] + p["verify_s"] + p["kv_s"],
                                              rel=1e-6, abs=1e-6)


def test_a_prompt_chunks_work_is_all_prefill(models, llm) -> None:
    """A request that ends with its first token verifies nothing: all of its ledger time is its prompt's
    (the rows built, their features copied for the drafter, the first token), none in the verify steps'
    host parts, which would otherwise carry a long prompt's copies."""
    with Speculator(llm, models["v2"], n_max=3) as spec:
        spec.generate("Hello", max_tokens=8, chat=False)
        out = spec.generate("Once upon a time there was a little house at the edge of a wood", max_tokens=1,
                            chat=False)
    p = out.stats["phases"]
    assert len(out.tokens) == 1 and p["prefill_s"] > 0, p
    # (the step around the chunk still plans: nothing to verify, a fraction of a microsecond)
    assert all(p[k] == 0.0 for k in ("build_s", "decode_s", "verify_s", "features_s", "sources_s", "kv_s")), p


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=0.7, top_p=0.0), "top_p"),
        (dict(temperature=0.7, min_p=2.0), "min_p"),
        # past what the native struct holds (int32 counts, a 64-bit seed): once an OverflowError from cffi
        (dict(seed=2**64), "seed"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(max_tokens=2**31), "max_tokens"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(top_k=2**31), "top_k"),
        (dict(top_k=-1), "top_k"),
        (dict(repeat_last_n=2**31), "repeat_last_n"),
        (dict(seed="7"), "seed"),
    ],
)
def test_bad_sampling_parameters(models, llm, kwargs, match) -> None:
    """A ValueError naming the parameter, from generate() and stream() alike; the Speculator serves on."""
    with Speculator(llm, models["v2"], n_max=2) as spec:
        with pytest.raises(ValueError, match=f"^{match} must be"):
            spec.generate("Hello", **{"max_tokens": 4, "chat": False, **kwargs})
        with pytest.raises(ValueError, match=f"^{match} must be"):
            next(spec.stream("Hello", **{"max_tokens": 4, "chat": False, **kwargs}))
        assert spec.generate("Hello", max_tokens=4, chat=False).finish_reason == "length"


def test_seed_is_taken_modulo_2_64(models, llm) -> None:
    """Any seed in -2**63..2**64-1 is taken (the server's range): -1 is 2**64-1."""
    with Speculator(llm, models["v2"], n_max=3) as spec:
        kw = dict(max_tokens=12, chat=False, temperature=0.9)
        a = spec.generate("Hello", seed=-1, **kw)
        assert a.tokens == spec.generate("Hello", seed=2**64 - 1, **kw).tokens
        assert spec.generate("Hello", seed=-(2**63), **kw).tokens == spec.generate("Hello", seed=2**63, **kw).tokens
        assert any(spec.generate("Hello", seed=s, **kw).tokens != a.tokens for s in range(4))  # the seed matters


def test_tree_without_flash_attention_is_not_exact(models, exact) -> None:
    """stats["exact"]: a tree's rows equal their paths decoded alone only with flash attention
    (docs/exactness.md), so a tree verified without it is never reported exact."""
    for flash_attn in (False, True):
        with Speculator(str(models["target"]), models["v2"], n_ctx=256, n_max=3, tree_budget=4,
                        flash_attn=flash_attn) as spec:
            out = spec.generate(PROMPTS[0], max_tokens=8, chat=False)
        assert out.stats["tree_budget"] == 4
        # with flash attention at 256 cells the f32 target is as batch-invariant as without a tree
        assert out.stats["exact"] is (flash_attn and exact), flash_attn
    # the rule itself, for a batch-invariant target whatever this build is
    invariant = exactness.Invariance(batch_invariant=True)
    assert greedy_is_exact(invariant, 3, 4, tree=False, flash_attn=False)
    assert greedy_is_exact(invariant, 3, 5, tree=True, flash_attn=True)
    assert not greedy_is_exact(invariant, 3, 5, tree=True, flash_attn=False)


def test_bad_prompts(models, llm) -> None:
    with Speculator(llm, models["v2"], n_max=2) as spec:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            spec.generate([1, 2, 99999], max_tokens=4)
        with pytest.raises(GenerationError, match="does not fit the context"):
            spec.generate([5] * 600, max_tokens=4)


def test_drafter_for_another_target_is_refused(tmp_path, llm) -> None:
    other = testing.make_target_gguf(tmp_path / "other.gguf", testing.TargetSpec(n_embd=96, n_head=4))
    ck = testing.make_drafter_checkpoint(tmp_path / "d", other)
    draft = testing.checkpoint_to_gguf(ck, other, tmp_path / "d.gguf")
    with pytest.raises(Exception, match="hidden size|does not match"):
        Speculator(llm, draft, n_max=2)


def test_bad_options(models, llm) -> None:
    with pytest.raises(ValueError, match="selector"):
        Speculator(llm, models["v2"], selector="beam")
    with pytest.raises(ValueError, match="n_max"):
        Speculator(llm, models["v2"], n_max=-3)


def test_auto_costs_are_measured_once_and_cached(models, llm, monkeypatch) -> None:
    import json
    import os

    cache = Path(os.environ["PYDFLASH2_CACHE_DIR"]) / "costs.json"
    monkeypatch.setattr(draft_costs, "machine_oversubscribed", lambda: False)
    with Speculator(llm, models["v1"], n_max="auto") as spec:
        costs = spec.costs
    assert costs is not None
    assert len(costs["verify_s"]) == spec.max_draft + 1 and len(costs["draft_s"]) == spec.max_draft
    assert all(t > 0 for t in costs["verify_s"] + costs["draft_s"])
    assert costs in json.loads(cache.read_text()).values()

    def no_measuring(*args, **kwargs):
        raise AssertionError("costs were measured again")

    monkeypatch.setattr(Speculator, "measure_costs", no_measuring)
    with Speculator(llm, models["v1"], n_max="auto") as spec:
        assert spec.costs == costs


def test_costs_measured_on_an_oversubscribed_machine_are_not_cached(models, llm, monkeypatch, tmp_path) -> None:
    import json

    monkeypatch.setenv("PYDFLASH2_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(draft_costs, "machine_oversubscribed", lambda: True)
    measured = []
    from pydflash2._engine import NativeEngine

    real_measure = NativeEngine.measure_costs

    def counting(self, *args, **kwargs):
        measured.append(1)
        return real_measure(self, *args, **kwargs)

    monkeypatch.setattr(NativeEngine, "measure_costs", counting)
    for _ in range(2):
        with Speculator(llm, models["v1"], n_max="auto") as spec:
            assert spec.costs is not None and spec.costs["oversubscribed"] is True
    assert len(measured) == 2  # measured again: the busy measurement was not kept
    assert not (tmp_path / "costs.json").exists() or json.loads((tmp_path / "costs.json").read_text()) == {}
    monkeypatch.setattr(draft_costs, "machine_oversubscribed", lambda: False)
    with Speculator(llm, models["v1"], n_max="auto") as spec:
        assert "oversubscribed" not in spec.costs
    assert len(measured) == 3 and len(json.loads((tmp_path / "costs.json").read_text())) == 1
