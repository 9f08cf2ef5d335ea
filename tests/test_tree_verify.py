"""Tree verification (issue 27): a step verifies the best-first tree of B drafted nodes in one
target decode (each node a row in the sequences of the leaves below it) and commits the path the
target's own choices follow. Each claim runs on the hot-token tiny target with a random DFlash2
drafter (the fast tier: its drafts are accepted and rejected often) and on SmolLM2-135M with the
shipped drafter (the slow tier, fewer prompts).

Greedy equals plain greedy decoding (bit-identical on a batch-invariant build, up to a near-tie
elsewhere: tests/lossless.py); sampled tokens follow llama-cpp-python's own sampling law
(chi-square); each tree row's logits equal those of its path decoded alone as a chain; after many
tree steps the target's KV cache holds exactly the committed tokens and the branch sequences
nothing; a server engine's slots verify their own trees in the shared decode.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from conftest import HOT
from lossless import DELTA_SMOLLM2, DELTA_TINY, check_greedy, plain_greedy, plain_greedy_chain
from sampling_law import Chain, ExactLaw, SpeculatorDraws, TargetLogits, sequential_test

from pydflash2 import exactness
from pydflash2.models import default_drafter, default_target
from pydflash2.speculator import GenerationError, Speculator, load_target

EVAL = Path(__file__).resolve().parent.parent / "benchmarks" / "prompts_chat_eval.txt"
N_TOKENS = 32
BUDGET = 16
N_CTX = 448


def _eval_prompts(n: int) -> list[str]:
    return [line.strip() for line in EVAL.read_text().splitlines() if line.strip()][:n]


@dataclass(frozen=True)
class Pair:
    target: str
    draft: str
    delta: float  # the near-tie rule's tolerance on a stock build (tests/lossless.py)
    logit_bias: dict[int, float]  # one token banned, one pushed up (both frequent here)
    n_prompts: int  # prompts per greedy claim


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def pair(request, hot_pair) -> Pair:
    if request.param == "tiny":
        return Pair(str(hot_pair[0]), str(hot_pair[1]), DELTA_TINY, {HOT[5]: -100.0, HOT[4]: 2.5}, 20)
    try:
        target = default_target()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    draft = default_drafter()
    assert draft is not None, "the shipped drafter is missing from this install"
    # 28 (",") banned, 30 (".") pushed up
    return Pair(str(target), str(draft), DELTA_SMOLLM2, {28: -100.0, 30: 2.5}, 6)


@pytest.fixture(scope="module")
def llm(pair) -> llama_cpp.Llama:
    """A target context with a unified KV cache, 1 + BUDGET sequences and flash attention (load_target's
    tree_budget), under 512 cells: flash attention is batch-invariant there (pydflash2.exactness)."""
    llm, _ = load_target(pair.target, n_ctx=N_CTX, n_threads=1, tree_budget=BUDGET)
    return llm


@pytest.fixture(scope="module")
def exact(llm) -> bool:
    inv = exactness.llama_invariance(llm)
    return inv.batch_invariant and inv.max_batch is None


def test_greedy_tree_is_plain_greedy(pair, llm, exact) -> None:
    """Hand-written chat prompts x B in {4, 16}: the same tokens as plain greedy decoding."""
    prompts = _eval_prompts(pair.n_prompts)
    with Speculator(llm, None, n_max=0) as spec:
        ids = {p: spec.tokenize_prompt(p) for p in prompts}
    plain = {p: plain_greedy(llm, ids[p], N_TOKENS) for p in prompts}
    parted = 0
    for budget in (4, 16):
        committed = steps = accepted = 0
        with Speculator(llm, pair.draft, n_max=7, tree_budget=budget) as spec:
            for p in prompts:
                out = spec.generate(p, max_tokens=N_TOKENS)
                assert out.stats["tree_budget"] == budget
                parted += check_greedy(out.tokens, plain[p], exact=exact, delta=pair.delta, what=(budget, p))
                committed += out.stats["n_generated"] - 1
                steps += out.stats["n_steps"]
                accepted += sum(out.stats["accepted_per_position"])
        print(f"tree budget {budget}: tau {committed / steps:.2f}, {accepted} drafts accepted")
        assert accepted > len(prompts)  # paths of the tree were committed, not only the anchors' bonus tokens
    print(f"{parted} of {2 * len(prompts)} runs left plain decoding at a near-tie (stock build only)")


CHAIN_SETTINGS = {
    "grammar": dict(grammar=r'''root ::= "[" ws item ("," ws item)* "]"
item ::= "\"" [a-z ]+ "\""
ws ::= [ \n]*'''),
    "penalties": dict(repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6),
    "logit_bias": {},  # the pair's own
}


@pytest.mark.parametrize("name", list(CHAIN_SETTINGS))
def test_sampler_chain_follows_the_committed_tree_path(pair, llm, exact, name) -> None:
    """Grammar, penalties and logit bias see the path the tree verify commits: greedy equals plain
    greedy decoding with the same chain; logprobs come for every committed token."""
    settings = CHAIN_SETTINGS[name] or dict(logit_bias=pair.logit_bias)
    prompts = ["List three colors.", "Describe a cat in one sentence."]
    with Speculator(llm, pair.draft, n_max=7, tree_budget=8) as spec:
        for p in prompts:
            ids = spec.tokenize_prompt(p)
            want = plain_greedy_chain(llm, ids, 20, **settings)
            out = spec.generate(p, max_tokens=20, logprobs=2, **settings)
            check_greedy(out.tokens, want, exact=exact, delta=pair.delta, what=(name, p))
            assert out.logprobs is not None and [lp.token for lp in out.logprobs] == out.tokens


@pytest.mark.parametrize("chain, wrong", [
    (Chain(temperature=1.0), Chain(temperature=0.85)),
    (Chain(temperature=0.7, top_p=0.9), Chain(temperature=0.85, top_p=0.9)),
])
def test_sampling_with_a_tree_follows_the_exact_law(pair, llm, chain, wrong) -> None:
    """SmolLM2's first 3 tokens (2 and 3 committed by tree verifies of 9 rows), one-sample against
    the exact law (tests/sampling_law.py), drawn until the same test rejects the wrong law."""
    if pair.delta != DELTA_SMOLLM2:
        pytest.skip("the tiny target's law: tests/test_sampling_law.py")
    if os.environ.get("PYDFLASH2_REQUIRE_SPECIAL_BUILD") == "1":
        pytest.skip("the sampling law does not depend on the build: the slow tier runs it")
    with Speculator(llm, None, n_max=0) as spec:
        ids = spec.tokenize_prompt("Name an animal and say one thing about it.")
    logits = TargetLogits(pair.target, ids, flash_attn=True)  # as the tree's context
    true_law, wrong_law = ExactLaw(logits, chain), ExactLaw(logits, wrong)
    try:
        with Speculator(llm, pair.draft, n_max=7, tree_budget=8) as spec:  # 9 rows: the law, at half the CPU of 16
            draws = SpeculatorDraws(spec, ids, chain, true_law.END, 3)
            sequential_test(draws, true_law, wrong_law, 3, chunk=100, what=f"tree T={chain.temperature}")
    finally:
        logits.close()
    print(f"tree depths accepted {draws.accepted} of {draws.drafted} reached")
    assert draws.accepted > 0


def _logits(ctx, row: int, n_vocab: int) -> np.ndarray:
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row), shape=(n_vocab,)).copy()


def test_tree_kv_holds_exactly_the_committed_tokens(pair, llm, exact) -> None:
    """After a long tree generation: the slot's sequence ends at the last committed position, every
    branch sequence is empty or a prefix of it (branches keep the context between steps) holding one
    cell per position, and the next token's logits equal those of a fresh context that prefilled the
    same text (the cached K/V are the committed tokens' own)."""
    with Speculator(llm, pair.draft, n_max=7, tree_budget=BUDGET) as spec:
        prompt = spec.tokenize_prompt(_eval_prompts(30)[-1])
        out = spec.generate(prompt, max_tokens=96)
        assert out.stats["n_steps"] > 10 and sum(out.stats["accepted_per_position"]) > 10
        ctx = spec._capturing.ctx if spec._capturing is not None else llm._ctx.ctx
        mem = llama_cpp.llama_get_memory(ctx)
        text = prompt + out.tokens
        # every committed token but the last (the next anchor) is in the cache
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(text) - 2
        assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0
        branch_cells = {}
        for b in range(1, BUDGET + 1):
            last = llama_cpp.llama_memory_seq_pos_max(mem, b)
            assert last <= len(text) - 2, b  # never the tree's rows, never beyond the slot
            if last >= 0:
                assert llama_cpp.llama_memory_seq_pos_min(mem, b) == 0, b
                branch_cells[b] = (last + 1, llama_cpp.llama_state_seq_get_size(ctx, b))
        assert branch_cells, "no branch kept the context"
        # the sequence's saved state holds its cells: as many as a context that decoded the text alone
        state_bytes = llama_cpp.llama_state_seq_get_size(ctx, 0)
        n_vocab = llm.n_vocab()
        batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(text[-1]), 1)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        got = _logits(ctx, -1, n_vocab)
        # the drafter holds committed rows only: never more than the target's cache
        assert spec.drafter is not None and spec.drafter.n_cached <= len(text) - 1
    ref, _ = load_target(pair.target, n_ctx=N_CTX, n_threads=1, lazy_head=False, flash_attn=True)
    ref.eval(text[:-1])
    assert llama_cpp.llama_state_seq_get_size(ref._ctx.ctx, 0) == state_bytes
    ref.eval(text[-1:])
    # a sequence's state is a header and its cells: each branch holds one cell per position
    per_cell = llama_cpp.llama_state_seq_get_size(ref._ctx.ctx, 0) - state_bytes
    for b, (n_pos, size) in branch_cells.items():
        assert size == state_bytes - per_cell * (len(text) - 1 - n_pos), b
    want = _logits(ref._ctx.ctx, -1, n_vocab)
    ref.close()
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        # the tree's batched rows round differently from a prefill's on the stock build: by as much
        # as batches of 8 against batch-1 decoding, 1.64 at most (tests/lossless.py), x 2 safety
        assert np.max(np.abs(got - want)) < 2 * 1.64, np.max(np.abs(got - want))


def test_a_request_starts_on_an_empty_borrowed_context(pair, llm) -> None:
    """Engines that share one Llama leave each other nothing: a tree engine's branch sequences keep
    cells after its request (for its next tree), and the next engine's request, plain here, starts on
    an empty KV cache. Cells left in a unified cache move where a decode's rows land and how many
    cells attention reads, which flips near-ties (benchmarks/ab_builds.py saw it)."""
    with Speculator(llm, pair.draft, n_max=7, tree_budget=BUDGET) as spec:
        prompt = spec.tokenize_prompt(_eval_prompts(2)[-1])
        spec.generate(prompt, max_tokens=24)
        ctx = spec._capturing.ctx if spec._capturing is not None else llm._ctx.ctx
        mem = llama_cpp.llama_get_memory(ctx)
        assert any(llama_cpp.llama_memory_seq_pos_max(mem, b) >= 0 for b in range(1, BUDGET + 1))
    with Speculator(llm, None, n_max=0) as plain:
        same = plain._capturing.ctx if plain._capturing is not None else llm._ctx.ctx
        assert ctypes.cast(same, ctypes.c_void_p).value == ctypes.cast(ctx, ctypes.c_void_p).value
        out = plain.generate(prompt, max_tokens=8)
        assert len(out.tokens) == 8
        for b in range(1, BUDGET + 1):
            assert llama_cpp.llama_memory_seq_pos_max(mem, b) == -1, b
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(prompt) + len(out.tokens) - 2


def test_auto_tree_budget_follows_the_costs(pair, llm, exact) -> None:
    """tree_budget="auto" prices every step from the costs: where verify rows cost nothing (a GPU's
    case) it verifies trees in most steps; where each row costs as much as the first, plain decoding
    wins and a tree is verified only as a probe. Greedy equals plain greedy either way."""
    prompts = _eval_prompts(4)
    with Speculator(llm, None, n_max=0) as spec:
        ids = {p: spec.tokenize_prompt(p) for p in prompts}
    plain = {p: plain_greedy(llm, ids[p], N_TOKENS) for p in prompts}
    with Speculator(llm, pair.draft, tree_budget="auto") as spec:
        # up to what the context was made for (load_target's tree_budget), costs measured that far
        assert spec.tree_budget == BUDGET and spec.tree_auto
        assert spec.costs is not None and len(spec.costs["verify_s"]) == BUDGET + 1
        free = [0.01] * (BUDGET + 1)
        dear = [0.01 * (1 + b) for b in range(BUDGET + 1)]
        for name, verify in (("free rows", free), ("dear rows", dear)):
            spec.set_costs(verify, [0.0005] * spec.max_draft)
            probes0 = spec.engine_stats()["tree_auto"]["probes"]
            trees = steps = 0
            for p in prompts:
                out = spec.generate(p, max_tokens=N_TOKENS)
                assert out.stats["tree_budget"] == "auto"
                check_greedy(out.tokens, plain[p], exact=exact, delta=pair.delta, what=(name, p))
                trees += out.stats["n_tree_steps"]
                steps += out.stats["n_steps"]
            probes = spec.engine_stats()["tree_auto"]["probes"] - probes0
            print(f"{name}: {trees} of {steps} steps verified a tree ({probes} probes)")
            if name == "free rows":
                assert trees > steps // 2
            else:
                assert trees == probes and probes <= 4


def test_prices_add_the_host_work_the_ledger_measures(pair, llm, exact) -> None:
    """The measured tables price the device's work; the host's (planning, selection, each row's
    verification, KV bookkeeping: the step ledger's host parts) is learned from the ledger as steps
    run and added to every price (issue 46). Where verify rows cost next to nothing on the device, as
    on a fast GPU, that host work decides: the same free rows that make trees win in most steps when
    the decode dominates (test_auto_tree_budget_follows_the_costs) leave them to probes here, once
    the host work of the first steps is known. Greedy equals plain greedy throughout."""
    prompts = _eval_prompts(3)
    with Speculator(llm, None, n_max=0) as spec:
        ids = {p: spec.tokenize_prompt(p) for p in prompts}
    plain = {p: plain_greedy(llm, ids[p], N_TOKENS) for p in prompts}
    with Speculator(llm, pair.draft, tree_budget="auto") as spec:
        device_row, device_draft, head = 1e-6, 1e-7, 2e-7  # a device far faster than this host
        spec.set_costs([device_row] * (BUDGET + 1), [device_draft] * spec.max_draft, head_s=head)
        trees = steps = 0
        for i, p in enumerate(prompts):
            out = spec.generate(p, max_tokens=N_TOKENS)
            check_greedy(out.tokens, plain[p], exact=exact, delta=pair.delta, what=("host", p))
            if i > 0:  # the first request learns the host work
                trees += out.stats["n_tree_steps"]
                steps += out.stats["n_steps"]
        e = spec.engine_stats()
    host, model = e["host_costs"], e["tree_auto"]
    print(f"host costs {host}; {trees} of {steps} later steps verified a tree ({model['probes']} probes)")
    assert host["plain_per_slot_s"] > 0 and host["draft_base_s"] + host["draft_per_row_s"] > 0
    # every price adds it: the tree's rate is its expected tokens over device + host seconds, the
    # device's with the lazy head's product for every committed token beyond the table's one row
    b, tokens = model["best_budget"], model["tree_expected_tokens"]
    seconds = (device_row + device_draft + head * (tokens - 1) + host["draft_base_s"] +
               host["draft_per_row_s"] * (b + 1))
    # (as the last step weighed it: that step's own host work was learned after, a sliver of the fit)
    assert model["tree_expected_tokens"] / model["tree_rate"] == pytest.approx(seconds, rel=0.05)
    assert trees <= max(4, steps // 4)


@pytest.mark.parametrize("tree_budget", [8, "auto"])
def test_server_slots_verify_their_own_trees(pair, llm, tree_budget) -> None:
    """The server's engine, 3 slots decoding at once, each its own tree in the shared decode; then
    3 more requests on the same slots (their caches reused after tree steps)."""
    from pydflash2.server.engine import BatchEngine

    prompts = _eval_prompts(6)
    with Speculator(llm, None, n_max=0) as spec:
        ids = [spec.tokenize_prompt(p) for p in prompts]
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    engine = BatchEngine(pair.target, pair.draft, n_slots=3, n_ctx=512, n_threads=1, n_max=7, tree_budget=tree_budget)
    if tree_budget == "auto":  # rows free, as on a GPU, so that the slots verify trees
        engine.set_costs([0.01] * engine.max_verify_rows, [0.0005] * engine.max_draft)
    got: list[list[int]] = []
    accepted = 0
    try:
        for first in (0, 3):
            outs: dict[int, list[int]] = {}
            for slot in range(3):
                engine.start(slot, ids[first + slot], max_tokens=N_TOKENS)
                outs[slot] = []
            while any(len(o) < N_TOKENS and not (o and llama_cpp.llama_vocab_is_eog(vocab, o[-1]))
                      for o in outs.values()):
                for slot, committed in enumerate(engine.step()):
                    assert committed is not None
                    outs[slot] += committed
            for slot in range(3):
                accepted += sum(engine.slot_stats(slot)["accepted_per_position"])
                engine.stop(slot)
                out = outs[slot]
                eog = next((i for i, t in enumerate(out) if llama_cpp.llama_vocab_is_eog(vocab, t)), None)
                got.append(out[:eog][:N_TOKENS])
    finally:
        engine.close()
    # near-ties allowed on every build: the slots share one unified cache, where one slot's new rows
    # may take cells freed below another slot's committed ones, and the key order then differs
    for p, toks, out in zip(prompts, ids, got, strict=True):
        check_greedy(out, plain_greedy(llm, toks, N_TOKENS), exact=False, delta=pair.delta, what=p)
    assert accepted > 5  # tree paths were committed in the shared decode


def test_tree_needs_a_unified_context_and_a_dflash2_drafter(pair, tmp_path) -> None:
    if pair.delta != DELTA_TINY:
        pytest.skip("a refusal: the tiny target shows it")
    plain_llm = llama_cpp.Llama(pair.target, n_ctx=256, n_threads=1, verbose=False)
    with pytest.raises(ValueError, match="unified KV cache"):
        Speculator(plain_llm, pair.draft, n_max=7, tree_budget=4)
    for bad in (-1, 256, 2.5, True, "big"):
        with pytest.raises(ValueError, match="tree_budget"):
            Speculator(plain_llm, pair.draft, n_max=7, tree_budget=bad)  # type: ignore[arg-type]
    plain_llm.close()
    llm, _ = load_target(pair.target, n_ctx=256, n_threads=1, tree_budget=2)
    with pytest.raises(GenerationError, match="this one has 3"):  # a context made for 2 nodes, asked for 8
        llm.context_params.n_seq_max = 1 + 8  # as if made for 8: the native side checks the real context
        Speculator(llm, pair.draft, n_max=7, tree_budget=8)
    llm.close()
