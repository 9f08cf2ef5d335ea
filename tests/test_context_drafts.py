"""Drafts from the context merged with the DFlash2 lattice into one verified tree (issue 35).

- The merged tree equals a float64 reference of best-first expansion over the union of both
  sources (shared prefixes merged, each estimate capped by its parent's, at most max_leaves leaves).
- Greedy with context drafts equals plain greedy decoding (bit-identical on a batch-invariant
  build, up to a near-tie elsewhere: tests/lossless.py), on prompts that repeat their context so
  that context drafts are both accepted and rejected: context drafts alone (no drafter), merged
  with the lattice's tree, at a fixed budget and with the cost model choosing.
- Sampling with context drafts (point-mass candidates beside the lattice's) follows the target's
  exact law after its chain (one-sample test, tests/sampling_law.py).
- After many merged-tree steps the target's KV cache holds exactly the committed tokens.
- The server engine's global cache: one per key (a key's past outputs draft only for that key),
  and bounded.
All on the hot-token tiny target with a random DFlash2 drafter.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import llama_cpp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lossless import DELTA_TINY, check_greedy, plain_greedy
from sampling_law import Chain, ExactLaw, TargetLogits, as_draw, sequential_test

from pydflash2 import exactness
from pydflash2._native import ffi, lib
from pydflash2.context_drafts import limits
from pydflash2.speculator import Speculator, load_target

N_CTX = 448
N_TOKENS = 40

# Prompts whose answers repeat what they were given (the tiny target writes its hot tokens; a
# prompt full of them gives the context index earlier occurrences to propose from).
REPEATING = [
    " the west wes the west the a the wes he the",
    "he t a the the west es w he t he a es the",
    " w es w es the the a t he es w es the the a t he",
    "Once upon a time the west was the west of the east",
]


# ---------------------------------------------------------------- the merge, against float64

def _merge_native(lat: dict, ctx: dict, budget: int, max_leaves: int) -> list[tuple]:
    def arrays(src: dict) -> tuple:
        n = len(src["parent"])
        return (ffi.new("int32_t[]", src["parent"] or [0]), ffi.new("int32_t[]", src["token"] or [0]),
                ffi.new("double[]", src["p"] or [0.0]), ffi.new("double[]", src["logp"] or [0.0]), n)

    la, ca = arrays(lat), arrays(ctx)
    cap = max(budget, 1)
    n = ffi.new("int32_t *")
    parent, depth, token = (ffi.new("int32_t[]", cap) for _ in range(3))
    origin = ffi.new("uint8_t[]", cap)
    logp = ffi.new("double[]", cap)
    rc = lib.pdf2_merge_draft_trees(*la, *ca, budget, max_leaves, n, parent, depth, token, origin, logp)
    assert rc == 0
    return [(parent[i], depth[i], token[i], origin[i], logp[i]) for i in range(n[0])]


def _merge_reference(lat: dict, ctx: dict, budget: int, max_leaves: int) -> list[tuple]:
    """Best-first expansion over the union, written from the definition in float64."""
    nodes: list[dict] = []  # union nodes in the order they were added
    index: dict[tuple[int, int], int] = {}
    for bit, src in ((1, lat), (2, ctx)):
        at: list[int] = []
        for parent, token, p in zip(src["parent"], src["token"], src["p"], strict=True):
            up = -1 if parent < 0 else at[parent]
            key = (up, token)
            if key not in index:
                index[key] = len(nodes)
                nodes.append({"parent": up, "token": token, "p": 0.0, "origin": 0,
                              "depth": 1 if up < 0 else nodes[up]["depth"] + 1})
            u = nodes[index[key]]
            u["p"] = max(u["p"], float(p))
            u["origin"] |= bit
            at.append(index[key])
    for u in nodes:  # parents first
        u["p"] = min(1.0, u["p"]) if u["parent"] < 0 else min(u["p"], nodes[u["parent"]]["p"])
    order = sorted(range(len(nodes)), key=lambda i: (-nodes[i]["p"], i))
    out: list[tuple] = []
    placed: dict[int, int] = {}
    children: dict[int, int] = {}
    leaves = 0
    for i in order:
        if len(out) >= budget:
            break
        u = nodes[i]
        if u["parent"] >= 0 and u["parent"] not in placed:
            continue
        new_leaf = u["parent"] < 0 or children.get(u["parent"], 0) > 0
        if new_leaf and leaves >= max_leaves:
            continue
        leaves += new_leaf
        if u["parent"] >= 0:
            children[u["parent"]] = children.get(u["parent"], 0) + 1
        placed[i] = len(out)
        out.append((-1 if u["parent"] < 0 else placed[u["parent"]], u["depth"], u["token"], u["origin"],
                    float(np.log(u["p"])) if u["p"] > 0 else -np.inf))
    return out


@st.composite
def tries(draw: st.DrawFn, max_nodes: int, alphabet: int) -> dict:
    """A random trie: each node under an earlier one (or the root), distinct tokens among siblings,
    estimates from a small set (ties happen) that need not decrease (the merge caps them)."""
    n = draw(st.integers(0, max_nodes))
    parent: list[int] = []
    token: list[int] = []
    for v in range(n):
        parent.append(draw(st.integers(-1, v - 1)))
        token.append(draw(st.integers(0, alphabet - 1)))
    seen: set[tuple[int, int]] = set()
    keep = [v for v in range(n) if (parent[v], token[v]) not in seen and not seen.add((parent[v], token[v]))]
    # drop duplicates and whatever hung under them
    alive: dict[int, int] = {}
    out = {"parent": [], "token": [], "p": [], "logp": []}
    for v in range(n):
        if v not in keep or (parent[v] >= 0 and parent[v] not in alive):
            continue
        alive[v] = len(out["parent"])
        out["parent"].append(-1 if parent[v] < 0 else alive[parent[v]])
        out["token"].append(token[v])
        p = draw(st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.5, 0.5, 0.8, 1.0]))
        out["p"].append(p)
        out["logp"].append(float(np.log(p)) if p > 0 else -1e9)
    return out


@settings(max_examples=300, deadline=None)
@given(lat=tries(24, 3), ctx=tries(24, 3), budget=st.integers(0, 30), max_leaves=st.integers(0, 9))
def test_merged_tree_equals_the_float64_reference(lat, ctx, budget, max_leaves) -> None:
    got = _merge_native(lat, ctx, budget, max_leaves)
    want = _merge_reference(lat, ctx, budget, max_leaves)
    assert [g[:4] for g in got] == [w[:4] for w in want]
    np.testing.assert_allclose([g[4] for g in got], [w[4] for w in want], rtol=0, atol=1e-12)
    # a best-first prefix is a tree: every parent comes first
    assert all(parent < i for i, (parent, *_) in enumerate(got))


def test_merge_refuses_bad_input() -> None:
    n = ffi.new("int32_t *")
    bad_parent = ffi.new("int32_t[]", [1])  # a node under a later one
    one = ffi.new("int32_t[]", [5])
    p = ffi.new("double[]", [0.5])
    assert lib.pdf2_merge_draft_trees(bad_parent, one, p, p, 1, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0, 4, 4, n,
                                      ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL) == -1
    from pydflash2._native import last_error

    assert "parent" in last_error()
    assert lib.pdf2_merge_draft_trees(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 3, ffi.NULL, ffi.NULL, ffi.NULL,
                                      ffi.NULL, 0, 4, 4, n, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL) == -1
    assert "NULL" in last_error()


# ---------------------------------------------------------------- lossless, on the tiny target

@pytest.fixture(scope="module")
def llm(hot_pair) -> llama_cpp.Llama:
    """A context made for context drafts (unified KV cache, their sequences, flash attention) under 512
    cells, where flash attention is batch-invariant (pydflash2.exactness)."""
    llm, _ = load_target(hot_pair[0], n_ctx=N_CTX, n_threads=1, tree_budget=16, context_drafts="request")
    return llm


@pytest.fixture(scope="module")
def exact(llm) -> bool:
    inv = exactness.llama_invariance(llm)
    return inv.batch_invariant and inv.max_batch is None


def _ids(llm: llama_cpp.Llama, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=True, special=False)


CONFIGS = {
    # name: Speculator arguments besides the target
    "context alone": dict(draft=None, n_max=0),
    "merged, tree 16": dict(n_max=7, tree_budget=16),
    "merged, auto": dict(n_max="auto", tree_budget="auto"),
    "merged, chain auto": dict(n_max="auto"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_with_context_drafts_is_plain_greedy(hot_pair, llm, exact, name) -> None:
    kwargs = dict(CONFIGS[name])
    draft = kwargs.pop("draft", str(hot_pair[1]))
    plain = {p: plain_greedy(llm, _ids(llm, p), N_TOKENS) for p in REPEATING}
    drafted = accepted = steps = committed = 0
    with Speculator(llm, draft, context_drafts="request", **kwargs) as spec:
        # rows nearly free (a GPU's case), so that the cost model verifies context trees; a step's
        # base far above this host's work per row, so that the host work the engine learns (more
        # under load) does not trim the trees to the drafts sure to be accepted
        spec.set_costs([0.05 + 0.0001 * b for b in range(spec.max_verify_rows)], [0.002] * spec.max_draft)
        for p in REPEATING:
            out = spec.generate(_ids(llm, p), max_tokens=N_TOKENS)
            check_greedy(out.tokens, plain[p], exact=exact, delta=DELTA_TINY, what=(name, p))
            drafted += out.stats["context_drafted"]
            accepted += out.stats["context_accepted"]
            steps += out.stats["n_steps"]
            committed += out.stats["n_generated"] - 1
    print(f"{name}: context nodes {accepted} accepted of {drafted}, tau {committed / max(steps, 1):.2f}")
    assert 0 < accepted < drafted  # context drafts were both accepted and rejected


def test_context_drafts_alone_skip_the_drafter(hot_pair, llm) -> None:
    """With costs where the drafter's propose is dear, a matching context is verified alone."""
    with Speculator(llm, str(hot_pair[1]), n_max="auto", context_drafts="request") as spec:
        spec.set_costs([0.01 + 0.0001 * b for b in range(spec.max_verify_rows)], [0.5] * spec.max_draft)
        out = spec.generate(_ids(llm, REPEATING[0]), max_tokens=N_TOKENS)
    assert out.stats["propose_skipped"] > 0 and out.stats["context_accepted"] > 0


def test_context_paths_go_deeper_than_the_block(hot_pair, llm, exact) -> None:
    """A long repeated span: one step commits more tokens than the drafter's block holds."""
    text = " the west wes he a t" * 6
    ids = _ids(llm, text)
    want = plain_greedy(llm, ids, 64)
    with Speculator(llm, None, n_max=0, context_drafts="request") as spec:
        spec.set_costs([0.01 + 0.0001 * b for b in range(spec.max_verify_rows)], [])
        out = spec.generate(ids, max_tokens=64)
    check_greedy(out.tokens, want, exact=exact, delta=DELTA_TINY, what="deep")
    accepted = out.stats["accepted_per_position"]
    print(f"tau {out.stats['tau']:.2f}, accepted per depth {accepted}")
    assert len(accepted) == limits().max_depth and any(accepted[7:])  # past a block of 7


class _ContextDraws:
    """draw(seed): the first n tokens of a generation, counting the context's drafts."""

    def __init__(self, spec: Speculator, ids: list[int], chain: Chain, end: int, n: int) -> None:
        self.spec, self.ids, self.chain, self.end, self.n = spec, ids, chain, end, n
        self.drafted = self.accepted = self.lattice = 0

    def __call__(self, seed: int):
        out = self.spec.generate(self.ids, max_tokens=self.n, seed=seed, **self.chain.kwargs())
        self.drafted += out.stats["context_drafted"]
        self.accepted += out.stats["context_accepted"]
        self.lattice += out.stats["lattice_drafted"]
        return as_draw(out.tokens, out.finish_reason == "eos", self.end, self.n)


@pytest.mark.parametrize("chain, wrong", [
    (Chain(temperature=1.0), Chain(temperature=0.85)),
    (Chain(temperature=0.7, top_p=0.9), Chain(temperature=0.85, top_p=0.9)),
])
def test_sampling_with_context_drafts_follows_the_exact_law(hot_pair, llm, chain, wrong) -> None:
    """The first 4 tokens of merged trees (context nodes are point masses beside the lattice's). The
    context is the Speculator's own past outputs ("global"): every draw repeats the prompt, whose
    first token is spread (0.63, 0.21, 0.04 at T=1), and earlier draws' outputs propose what follows."""
    n = 4
    ids = _ids(llm, "Once upon a time")
    logits = TargetLogits(str(hot_pair[0]), ids, flash_attn=True)
    true_law, wrong_law = ExactLaw(logits, chain), ExactLaw(logits, wrong)
    try:
        with Speculator(llm, str(hot_pair[1]), n_max=7, tree_budget=8, context_drafts="global") as spec:
            draws = _ContextDraws(spec, ids, chain, true_law.END, n)
            sequential_test(draws, true_law, wrong_law, n, what=f"context T={chain.temperature}")
    finally:
        logits.close()
    print(f"context nodes accepted {draws.accepted} of {draws.drafted}; lattice nodes {draws.lattice}")
    # context and lattice nodes side by side in the trees (after its first token this target is nearly
    # deterministic, so the context's drafts are rarely wrong here: the greedy tests reject them often)
    assert draws.accepted > 0 and draws.lattice > 0


def test_kv_holds_exactly_the_committed_tokens_after_merged_trees(hot_pair, llm, exact) -> None:
    """After a long generation of merged trees: the slot's sequence ends at the last committed
    position, every branch sequence is empty or a prefix of it (branches keep the context between
    steps; test_tree_verify counts their cells), and the next token's logits equal those of a fresh
    context that prefilled the same text."""
    with Speculator(llm, str(hot_pair[1]), n_max=7, tree_budget=16, context_drafts="request") as spec:
        prompt = _ids(llm, REPEATING[1] * 3)
        out = spec.generate(prompt, max_tokens=120)
        assert out.stats["n_steps"] > 10 and out.stats["context_accepted"] > 10
        ctx = spec._capturing.ctx if spec._capturing is not None else llm._ctx.ctx
        mem = llama_cpp.llama_get_memory(ctx)
        text = prompt + out.tokens
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(text) - 2
        for b in range(1, int(llm.context_params.n_seq_max)):
            last = llama_cpp.llama_memory_seq_pos_max(mem, b)
            assert last <= len(text) - 2, b
            assert last < 0 or llama_cpp.llama_memory_seq_pos_min(mem, b) == 0, b
        n_vocab = llm.n_vocab()
        batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(text[-1]), 1)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        got = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    ref, _ = load_target(hot_pair[0], n_ctx=N_CTX, n_threads=1, lazy_head=False, flash_attn=True)
    ref.eval(text)
    want = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref._ctx.ctx, -1), shape=(n_vocab,)).copy()
    ref.close()
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        assert np.max(np.abs(got - want)) < 2 * 1.64, np.max(np.abs(got - want))


def test_bad_context_drafts_arguments(hot_pair) -> None:
    plain_llm = llama_cpp.Llama(str(hot_pair[0]), n_ctx=256, n_threads=1, verbose=False)
    with pytest.raises(ValueError, match="unified KV cache"):
        Speculator(plain_llm, None, n_max=0, context_drafts="request")
    with pytest.raises(ValueError, match="context_drafts"):
        Speculator(plain_llm, None, n_max=0, context_drafts="sometimes")
    plain_llm.close()


# ---------------------------------------------------------------- the server engine's global cache

def _run_engine(engine, slot: int, ids: list[int], key: str, n: int) -> tuple[list[int], dict]:
    engine.start(slot, ids, max_tokens=n, context_key=key)
    out: list[int] = []
    while len(out) < n:
        committed = engine.step()[slot]
        assert committed is not None
        out += committed
    stats = engine.slot_stats(slot)
    engine.stop(slot)
    return out[:n], stats


def test_global_cache_is_per_key_and_bounded(hot_pair, llm, exact) -> None:
    """Past outputs draft for their own key only: the same prompt again under key a is drafted from
    a's last output (its first tokens, which its own prompt does not hold), under key b it is not.
    The answers are plain greedy's either way. Many requests later the cache is within its bounds."""
    from pydflash2.server.engine import BatchEngine

    engine = BatchEngine(hot_pair[0], hot_pair[1], n_slots=2, n_ctx=N_CTX, n_threads=1, n_max="auto",
                         context_drafts="global")
    try:
        engine.set_costs([0.01 + 0.0001 * b for b in range(engine.max_verify_rows)], [0.002] * engine.max_draft)
        prompt = _ids(llm, "Once upon a time")
        want = plain_greedy(llm, prompt, N_TOKENS)
        first, _ = _run_engine(engine, 0, prompt, "a", N_TOKENS)
        again, stats_a = _run_engine(engine, 0, prompt, "a", N_TOKENS)
        other, stats_b = _run_engine(engine, 1, prompt, "b", N_TOKENS)
        for out in (first, again, other):
            check_greedy(out, want, exact=False, delta=DELTA_TINY, what="global")
        print(f"key a again: {stats_a['context_accepted']} context drafts accepted, "
              f"key b: {stats_b['context_accepted']}")
        assert stats_a["context_accepted"] > stats_b["context_accepted"]
        # a soak: 40 requests under 4 keys, each cache keeping few documents
        engine.set_context_cache_limits(max_keys=3, max_documents=2, max_tokens=64)
        for i in range(40):
            _run_engine(engine, i % 2, _ids(llm, REPEATING[i % len(REPEATING)]), f"k{i % 4}", 12)
            c = engine.stats()["context"]
            assert c["cache_keys"] <= 3 and c["cache_documents"] <= 3 * 2 and c["cache_tokens"] <= 3 * 64, c
    finally:
        engine.close()


# ---------------------------------------------------------------- a third source, plugged in

def test_a_registered_source_joins_the_merged_tree(hot_pair, llm, exact) -> None:
    """The "repeat" source (native repeat_draft_source.cpp: one file and one line in
    draft_sources.cpp's registry) proposes the last tokens' repeated run. Added to a Speculator, the
    merged tree verifies its candidates beside the context's and the lattice's, greedy stays plain
    greedy, and each source counts its own drafts. Prompts of a short period, so that it matches."""
    prompts = [" the west" * 5, " he a t" * 6]
    plain = {p: plain_greedy(llm, _ids(llm, p), N_TOKENS) for p in prompts}
    with Speculator(llm, str(hot_pair[1]), n_max=7, tree_budget=16, context_drafts="request") as spec:
        with pytest.raises(Exception, match="unknown draft source 'nope' \\(known: context, repeat, prompt-echo\\)"):
            spec.add_draft_source("nope")
        spec.add_draft_source("repeat")
        with pytest.raises(Exception, match="already there"):
            spec.add_draft_source("repeat")
        sources: dict[str, dict[str, int]] = {}
        for p in prompts:
            out = spec.generate(_ids(llm, p), max_tokens=N_TOKENS)
            check_greedy(out.tokens, plain[p], exact=exact, delta=DELTA_TINY, what=("repeat", p))
            for name, c in out.stats["sources"].items():
                for k in ("drafted", "accepted"):
                    sources.setdefault(name, {}).setdefault(k, 0)
                    sources[name][k] += c[k]
        engine = spec.engine_stats()["sources"]
    print(f"drafts by source: {sources}")
    assert set(sources) == {"lattice", "context", "repeat"}
    assert sources["repeat"]["accepted"] > 0  # its candidates were in the verified trees, and right
    assert engine["repeat"]["drafted"] == sources["repeat"]["drafted"]  # the engine's sum over requests
    assert out.stats["lattice_drafted"] == out.stats["sources"]["lattice"]["drafted"]


def _source_block(name: str, prompt: list[int], committed: list[int], n: int, tree_budget: int) -> tuple:
    """One registered source alone (native pdf2_draft_source_block): its block's nodes as
    (token, parent) pairs, and whether it is a tree."""
    cap = 64
    token, parent = ffi.new("int32_t[]", cap), ffi.new("int32_t[]", cap)
    n_nodes, is_tree = ffi.new("int32_t *"), ffi.new("int32_t *")
    assert lib.pdf2_draft_source_block(name.encode(), ffi.new("int32_t[]", prompt), len(prompt),
                                       ffi.new("int32_t[]", committed), len(committed), n, tree_budget, cap,
                                       token, parent, n_nodes, is_tree) == 0
    return [(token[i], parent[i]) for i in range(n_nodes[0])], bool(is_tree[0])


def test_a_toy_source_drafts_chains_and_tree_nodes() -> None:
    """The fourth source, "prompt-echo" (native prompt_echo_draft_source.cpp: one file and one line of
    the registry), as a function of its context, its docstring's worked example: prompt [5 6 7 5 8],
    the stream ending in 5. Asked for a chain it drafts the latest occurrence's continuation; for
    tree nodes, its branches best first (the latest occurrence's first)."""
    prompt = [5, 6, 7, 5, 8]
    chain, is_tree = _source_block("prompt-echo", prompt, [9, 5], 3, 0)
    assert not is_tree and chain == [(8, -1)]
    tree, is_tree = _source_block("prompt-echo", prompt, [9, 5], 3, 8)
    assert is_tree and sorted(tree) == sorted([(8, -1), (6, -1), (7, 1), (5, 2)])
    assert tree[0] == (8, -1)  # the latest occurrence's branch is the more likely
    assert _source_block("prompt-echo", prompt, [9, 5], 3, 2)[0] == [(8, -1), (6, -1)]  # a budget of 2: the best 2
    assert _source_block("prompt-echo", prompt, [9, 4], 3, 8) == ([], False)  # 4 is not in the prompt
    with pytest.raises(AssertionError):
        _source_block("nope", prompt, [], 3, 0)
    from pydflash2._native import last_error

    assert "unknown draft source 'nope'" in last_error()


def test_a_toy_source_is_priced_and_merged_like_the_lattice(hot_pair, llm, exact) -> None:
    """Added by name to an automatic engine (the draft length and the tree budget from the costs),
    the toy's offer is priced by the same cost model and merged by the same tree as the lattice's and
    the context's: its nodes are verified and accepted, greedy stays plain greedy, and the dispatcher
    counts and times every call to it."""
    plain = {p: plain_greedy(llm, _ids(llm, p), N_TOKENS) for p in REPEATING}
    sources: dict[str, int] = {}
    plans: set[str] = set()
    with Speculator(llm, str(hot_pair[1]), n_max="auto", tree_budget="auto", context_drafts="request") as spec:
        spec.add_draft_source("prompt-echo")
        # rows nearly free (a GPU's case), so that the cost model verifies merged trees
        spec.set_costs([0.01 + 0.0001 * b for b in range(spec.max_verify_rows)], [0.002] * spec.max_draft)
        for p in REPEATING:
            out = spec.generate(_ids(llm, p), max_tokens=N_TOKENS)
            check_greedy(out.tokens, plain[p], exact=exact, delta=DELTA_TINY, what=("prompt-echo", p))
            for k in ("drafted", "accepted"):
                sources[k] = sources.get(k, 0) + out.stats["sources"]["prompt-echo"][k]
            plans |= {x["plan"] for x in out.stats["plans"]}
        engine = spec.engine_stats()["sources"]
    print(f"prompt-echo: {sources}; plans {sorted(plans)}")
    assert sources["accepted"] > 0 and sources["drafted"] >= sources["accepted"]
    assert plans & {"merged tree", "candidates' tree"}
    assert engine["prompt-echo"]["calls"] > 0 and engine["prompt-echo"]["seconds"] > 0
    assert engine["prompt-echo"]["drafted"] == sources["drafted"]


def test_a_source_needs_merged_trees(hot_pair) -> None:
    llm, _ = load_target(hot_pair[0], n_ctx=256, n_threads=1)
    with Speculator(llm, str(hot_pair[1]), n_max=3) as spec, pytest.raises(Exception, match="needs merged trees"):
        spec.add_draft_source("repeat")


# ---------------------------------------------------------------- the plain baseline

def test_auto_decodes_plainly_where_drafts_lose_to_the_plain_step(hot_pair, llm, exact) -> None:
    """The cost model's plain option is the measured plain step (a decode without the drafter's
    features), not its own one-row verify. With a GPU's shape of costs (issue 46: a verify of 1-8 rows
    nearly flat, but twice what a plain step costs) auto drafts when plain is priced at the one-row
    verify, and decodes plainly once plain is priced at the plain step, its plain steps then skipping
    the drafter's features; the tokens stay plain greedy's either way."""
    prompt = REPEATING[0]
    ids = _ids(llm, prompt)
    want = plain_greedy(llm, ids, N_TOKENS)
    steps = {}
    with Speculator(llm, str(hot_pair[1]), n_max="auto") as spec:
        verify = [0.00262] + [0.0027] * (spec.max_verify_rows - 1)
        for plain_s in (0.0, 0.0003):  # unknown (the one-row verify prices plain), then a plain step 9x cheaper
            spec.set_costs(verify, [0.00038] * spec.max_draft, plain_s)
            unfed0 = spec.engine_stats()["unfed_steps"]
            out = spec.generate(ids, max_tokens=N_TOKENS)
            check_greedy(out.tokens, want, exact=exact, delta=DELTA_TINY, what=("plain baseline", plain_s))
            steps[plain_s] = (out.stats["n_steps"], out.stats["n_spec_steps"],
                              spec.engine_stats()["unfed_steps"] - unfed0)
    print(f"(steps, drafting steps, unfed plain steps) by plain_s: {steps}")
    n, drafting, unfed = steps[0.0]
    assert drafting >= 5 and unfed == 0  # drafting looks cheap against the one-row verify
    n, drafting, unfed = steps[0.0003]
    assert drafting <= 2 and unfed >= n - drafting - 1  # plain (probes aside), without the features


@contextlib.contextmanager
def llama_log_lines(substring: str) -> Iterator[list[str]]:
    """The llama.cpp log lines containing substring, logged inside the block (then logs go quiet again)."""
    from llama_cpp import llama_cpp as lc

    seen: list[str] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def keep(level: int, text: bytes, user_data: int) -> None:
        line = text.decode(errors="replace")
        if substring in line:
            seen.append(line)

    lc.llama_log_set(keep, ctypes.c_void_p(0))
    try:
        yield seen
    finally:
        lc.llama_log_set(_QUIET, ctypes.c_void_p(0))


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _QUIET(level: int, text: bytes, user_data: int) -> None:  # noqa: N802  (a C callback, kept alive here)
    return None


def test_plain_steps_that_starve_the_drafter_keep_the_taps(hot_pair, llm, exact) -> None:
    """The speculation tax (issue 57): every llama_set_embeddings_layer_inp call makes llama.cpp reserve
    its scheduler again before the next decode (a worst-case graph built, every cached graph dropped).
    The engine turned the taps off for each plain step that starves the drafter and on for the next
    verify, so every such verify paid a reserve: 1.4x a plain step on SmolLM2 (2 threads). The taps now
    stay set through a request and through measure_costs, which alternates the two kinds of decode;
    the unfed steps still skip the drafter's features, and the tokens stay plain greedy's."""
    ids = _ids(llm, REPEATING[0])
    want = plain_greedy(llm, ids, N_TOKENS)
    with Speculator(llm, str(hot_pair[1]), n_max="auto") as spec:
        assert spec.capture_path == "tap"
        verify = [0.00262] + [0.0027] * (spec.max_verify_rows - 1)
        # the first request sets the taps (a reserve); later ones find them set
        spec.set_costs(verify, [0.00038] * spec.max_draft, 0.0003)  # plain steps starve the drafter
        spec.generate(ids, max_tokens=4)
        with llama_log_lines("sched_reserve: reserving ...") as reserves:
            costs = spec.measure_costs(ids, reps=3)  # a starved plain decode, then verifies, each rep
            spec.set_costs(verify, [0.00038] * spec.max_draft, 0.0003)
            probes0 = spec.engine_stats()["unfed_steps"]
            out = spec.generate(ids, max_tokens=N_TOKENS)
        stats = spec.engine_stats()
    check_greedy(out.tokens, want, exact=exact, delta=DELTA_TINY, what="starved plain steps")
    unfed = stats["unfed_steps"] - probes0
    fed_one = stats["fed_decodes_by_rows"][0] if stats["fed_decodes_by_rows"] else 0
    print(f"reserves {len(reserves)}, unfed steps {unfed}, steps {out.stats['n_steps']}, costs plain "
          f"{costs['plain_s']:.2e} verify1 {costs['verify_s'][0]:.2e}, fed one-row decodes {fed_one}")
    assert unfed > 0  # the drafter was starved...
    assert stats["decodes_by_rows"][0] > fed_one  # ...on the decodes counted as unfed
    assert reserves == []  # measure_costs' 3 reps and a request: nothing set again


def test_learned_costs_follow_what_the_steps_take(hot_pair, llm, exact) -> None:
    """Costs measured on this machine are corrected by the steps as they run (issue 46: a table timed
    in a loop of its own priced SmolLM2's plain step at 10.5 ms against 7-8.6 ms in use): a plain
    step's price becomes the device seconds plain steps took, every other decode's the table scaled
    by what the verify steps took against it. Costs a caller sets without learn stay as given."""
    ids = _ids(llm, REPEATING[0])
    want = plain_greedy(llm, ids, N_TOKENS)
    table = 0.01  # 10 ms for a decode of any size: far slower than this tiny target
    with Speculator(llm, str(hot_pair[1]), n_max="auto", tree_budget="auto") as spec:
        for learn in (False, True):
            spec.set_costs([table] * spec.max_verify_rows, [0.0001] * spec.max_draft, 0.0, learn=learn)
            out = spec.generate(ids, max_tokens=N_TOKENS)
            check_greedy(out.tokens, want, exact=exact, delta=DELTA_TINY, what=("learned costs", learn))
            e = spec.engine_stats()
            seen, host = e["device_seen"], e["host_costs"]
            if not learn:
                assert seen == {"plain_s": 0.0, "verify_scale": 1.0}
                continue
            p = out.stats["phases"]  # the step ledger's parts over the request
            device = (p["decode_s"] + p["sync_s"] + p["head_s"]) / out.stats["n_steps"]  # per step, as run
            print(f"device seconds per step {device:.2e}; seen {seen}")
            assert out.stats["n_spec_steps"] >= 3 and seen["verify_scale"] < 0.5
            assert 0.2 * device < seen["verify_scale"] * table < 5 * device
            # plain decoding is priced at what plain steps took (none seen: the table's), plus the host's work
            plain_device = seen["plain_s"] or table
            assert 1 / e["tree_auto"]["plain_rate"] == pytest.approx(plain_device + host["plain_per_slot_s"], rel=1e-6)


def test_greedy_requests_do_not_teach_sampled_ones_the_contexts_acceptance(hot_pair, llm) -> None:
    """The context's acceptance is learned per regime (issue 57): greedy requests that copy their
    context teach nothing to the pricing of a sampled request's context drafts, so a sampled request
    drafts exactly as it does on a fresh engine, while a second greedy request drafts as the first
    ones taught it (not as a fresh engine would). Costs fixed (a CPU's steep rows) so that what
    changes the drafts is the learned acceptance alone."""
    ids = _ids(llm, " the west wes he a t" * 6)

    def context_drafting(prime: int, temperature: float) -> tuple:
        with Speculator(llm, None, n_max=0, context_drafts="request") as spec:
            spec.set_costs([0.01 + 0.004 * b for b in range(spec.max_verify_rows)], [])
            for _ in range(prime):
                spec.generate(ids, max_tokens=48)
            out = spec.generate(ids, max_tokens=24, temperature=temperature, seed=7)
            return out.stats["context_drafted"], tuple(out.stats["drafted_per_position"]), tuple(out.tokens)

    sampled_fresh, sampled_primed = context_drafting(0, 1.0), context_drafting(3, 1.0)
    assert sampled_primed == sampled_fresh
    greedy_fresh, greedy_primed = context_drafting(0, 0.0), context_drafting(3, 0.0)
    print(f"context nodes drafted: sampled {sampled_fresh[0]}, greedy {greedy_fresh[0]} fresh and "
          f"{greedy_primed[0]} after 3 greedy requests")
    assert greedy_primed[:2] != greedy_fresh[:2]  # the greedy regime did learn


@pytest.mark.parametrize("name", ["context alone", "merged, tree 16"])
def test_lazy_head_groups_give_the_rows_one_at_a_time_give(hot_pair, llm, exact, name) -> None:
    """The lazy LM head's products in groups of 8 rows (where reading the head's weight bounds them)
    give each row the logits the one-row products give: the same greedy tokens, plain greedy's, on
    context and merged trees whose verifies read rows along a path (not in order); and a group is
    counted in the rows whose head ran. Out-of-range groups are refused."""
    kwargs = dict(CONFIGS[name])
    draft = kwargs.pop("draft", str(hot_pair[1]))
    runs = {}
    for group in (1, 8):
        with Speculator(llm, draft, context_drafts="request", **kwargs) as spec:
            spec._native.set_lazy_head_group(group)
            spec.set_costs([0.01 + 0.0001 * b for b in range(spec.max_verify_rows)], [0.002] * spec.max_draft)
            outs = [spec.generate(_ids(llm, p), max_tokens=N_TOKENS) for p in REPEATING]
            e = spec.engine_stats()
            runs[group] = ([o.tokens for o in outs], e["lazy_head_group"], e["lazy_head_rows"],
                           e["lazy_head_rows_read"])
            if group == 8:
                for bad in (-1, 9):
                    with pytest.raises(Exception, match="lazy head group"):
                        spec._native.set_lazy_head_group(bad)
    assert runs[8][0] == runs[1][0]
    for p, tokens in zip(REPEATING, runs[1][0], strict=True):
        check_greedy(tokens, plain_greedy(llm, _ids(llm, p), N_TOKENS), exact=exact, delta=DELTA_TINY, what=(name, p))
    assert (runs[1][1], runs[8][1]) == (1, 8)
    # one at a time, the head runs the rows read; groups also compute rows the verify does not read.
    # (Within a run: the plans, so the rows drafted, follow the step times the engine measures.)
    assert runs[1][2] == runs[1][3] > 0
    assert runs[8][2] > runs[8][3] > 0


def test_greedy_requests_do_not_teach_sampled_ones_the_lattices_acceptance(hot_pair, llm) -> None:
    """The lattice's chain acceptance is learned per regime too: after greedy requests (whose
    random drafter's drafts are all rejected), a sampled request drafts as on a fresh engine (its
    regime's estimate is still the prior), while a greedy one has learned to decode plainly.
    Costs fixed (a row a tenth of a plain step, drafting cheap) so that drafting pays at the prior
    and only the learned acceptance changes the drafts."""
    ids = _ids(llm, REPEATING[3])

    def lattice_drafting(prime: int, temperature: float) -> tuple:
        with Speculator(llm, str(hot_pair[1]), n_max="auto") as spec:
            spec.set_costs([0.01 + 0.001 * b for b in range(spec.max_verify_rows)], [0.0005] * spec.max_draft)
            for _ in range(prime):
                spec.generate(ids, max_tokens=32)
            out = spec.generate(ids, max_tokens=24, temperature=temperature, seed=11)
            return tuple(out.stats["n_max_histogram"]), out.stats["lattice_drafted"], tuple(out.tokens)

    sampled_fresh, sampled_primed = lattice_drafting(0, 1.0), lattice_drafting(3, 1.0)
    fresh, primed = lattice_drafting(0, 0.0), lattice_drafting(3, 0.0)
    print(f"lattice drafts, fresh and after 3 greedy requests: sampled {sampled_fresh[1]} and "
          f"{sampled_primed[1]}, greedy {fresh[1]} and {primed[1]}")
    # (the engine-wide host costs and probe schedule also move with the greedy requests: the drafts
    # of a sampled request stay near a fresh engine's, not equal; pooled, they fell to none)
    assert sampled_primed[1] >= sampled_fresh[1] // 2 > 0
    assert primed[1] <= fresh[1] // 4  # the greedy regime did learn


@pytest.mark.parametrize("name", ["context alone", "merged, tree 16"])
def test_the_verifies_head_is_chosen_from_the_measured_costs(hot_pair, llm, exact, name) -> None:
    """The full LM head (every verify row's head in the decode's graph) or the lazy one (cut before
    the head, each row's product as the verify reads it), chosen from the measured tables (issue 57):
    where the full head's decodes cost what the lazy head's do with one more row read, the verifies
    take the full head (no lazy products); where every head row adds a product's cost, the lazy head;
    in between, verifies up to the rows where the two cross. Both give plain greedy's tokens. A lazy
    head group set, and exact batches, keep the lazy head; set_head_mode overrides the costs."""
    kwargs = dict(CONFIGS[name])
    draft = kwargs.pop("draft", str(hot_pair[1]))
    ids = [_ids(llm, p) for p in REPEATING[:2]]
    ref = [plain_greedy(llm, i, N_TOKENS) for i in ids]
    head = 0.004
    lazy = [0.01 + 0.0001 * b for b in range(40)]
    cases = {  # the full head's extra over the lazy table, per size b: -> the rows it is chosen up to
        "flat": (lambda b: 0.0, None),              # a weight-bound head: full everywhere
        "steep": (lambda b: head * b, 0),           # every row a product: lazy everywhere
        "crossing": (lambda b: head * (b - 1) / 4, 5),  # <= one product up to 5 rows
    }
    with Speculator(llm, draft, context_drafts="request", **kwargs) as spec:
        for case, (extra, rows) in cases.items():
            n = spec.max_verify_rows
            v = lazy[:n]
            full = [v[0]] + [v[b - 1] + extra(b) for b in range(2, n + 1)]
            spec.set_costs(v, [0.002] * spec.max_draft, head_s=head, verify_full_s=full)
            e = spec.engine_stats()
            want = n if rows is None else rows
            assert e["full_head_rows"] == want and e["head_chosen_by"] == "costs", (case, e["head"])
            assert e["head"] == ("full" if want == n else "lazy" if want == 0 else f"full up to {want} rows")
            rows0 = spec.engine_stats()["lazy_head_rows"]
            outs = [spec.generate(i, max_tokens=N_TOKENS) for i in ids]
            rows_read = spec.engine_stats()["lazy_head_rows"] - rows0
            for p, out, r in zip(REPEATING[:2], outs, ref, strict=True):
                check_greedy(out.tokens, r, exact=exact, delta=DELTA_TINY, what=(name, case, p))
            drafted = sum(o.stats["lattice_drafted"] + o.stats["context_drafted"] for o in outs)
            assert drafted > 0, case
            if case == "flat":
                assert rows_read == 0 and all(o.stats["lazy_head"] is False for o in outs)
            if case == "steep":
                assert rows_read > 0 and all(o.stats["lazy_head"] is True for o in outs)
            # the same tables without the full head's: the lazy head, as before
            spec.set_costs(v, [0.002] * spec.max_draft, head_s=head)
            assert spec.engine_stats()["full_head_rows"] == 0
            # set: a lazy head group, exact batches and the mode override the costs
            spec.set_costs(v, [0.002] * spec.max_draft, head_s=head, verify_full_s=full)
            spec._native.set_lazy_head_group(1)
            assert (spec.engine_stats()["full_head_rows"], spec.engine_stats()["head_chosen_by"]) == (0, "set")
            spec._native.set_lazy_head_group(0)
            assert spec.engine_stats()["full_head_rows"] == want
            spec._native.set_head_mode("full")
            assert spec.engine_stats()["full_head_rows"] == n
            spec._native.set_head_mode("lazy")
            assert spec.engine_stats()["full_head_rows"] == 0
            spec._native.set_head_mode("auto")
            spec._native.set_exact_batches(n)
            assert spec.engine_stats()["full_head_rows"] == 0
            spec._native.set_exact_batches(0)
            assert spec.engine_stats()["full_head_rows"] == want
            with pytest.raises(ValueError, match="head mode"):
                spec._native.set_head_mode("both")


def test_measured_costs_time_both_heads(hot_pair, llm) -> None:
    """Where the lazy head can run, measure_costs times every verify size with the full head too
    (the engine chooses between them: the test above); without a head to cut, no full table."""
    with Speculator(llm, str(hot_pair[1]), n_max=3) as spec:
        costs = spec.measure_costs(_ids(llm, REPEATING[0]), reps=1)
        assert len(costs["verify_full_s"]) == spec.max_verify_rows and all(x > 0 for x in costs["verify_full_s"])
        assert costs["verify_full_s"][0] == costs["verify_s"][0] and costs["head_s"] > 0
        spec.set_costs(costs["verify_s"], costs["draft_s"], head_s=costs["head_s"],
                       verify_full_s=costs["verify_full_s"])
        e = spec.engine_stats()
        assert e["head_chosen_by"] == "costs" and 0 <= e["full_head_rows"] <= spec.max_verify_rows
    with Speculator(llm, str(hot_pair[1]), n_max=3, lazy_head=False) as spec:
        costs = spec.measure_costs(_ids(llm, REPEATING[0]), reps=1)
        assert costs["verify_full_s"] == [] and costs["head_s"] == 0
        assert spec.engine_stats()["head"] == "full"
