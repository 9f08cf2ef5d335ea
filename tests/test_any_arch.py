"""Targets of any llama.cpp architecture.

qwen2 and gemma3 have no layer-input taps in the pinned llama.cpp: their drafter
features come through the graph evaluation callback (pydflash2.capture). On a
llama target, where both paths exist, the callback's rows equal the taps' bit
for bit. Every model here is a real GGUF made at test time and run by llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pydflash2_testing as testing
import pytest
from lossless import check_greedy, greedy_generate
from lossless import plain_greedy as plain_run
from pydflash2.convert.cli import main as convert_main
from pydflash2_testing.upstream import ext

from pydflash2 import capture, exactness
from pydflash2.drafter import Drafter
from pydflash2.speculator import GenerationError, Speculator

CALLBACK_ARCHS = ("qwen2", "gemma3")
HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
# HF ids; 3 is the last layer of the 4-layer targets: its output is GGUF layer input 4 = n_layer,
# which only the callback path gives
LAYER_IDS = (0, 2, 3)
PROMPTS = ["Once upon a time", "The answer is", "def main():", "A small drafter", "quick brown", "Paris"]


@pytest.fixture(scope="module", params=CALLBACK_ARCHS)
def arch_models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    target = testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(arch=arch, hot_tokens=HOT))
    ckpt = testing.make_drafter_checkpoint(d / "hf", target, testing.DrafterSpec(target_layer_ids=LAYER_IDS))
    drafter = d / "drafter.gguf"
    assert convert_main([str(ckpt), "--target", str(target), "-o", str(drafter), "--no-progress"]) == 0
    return {"arch": arch, "target": target, "drafter": drafter, "ckpt": ckpt}


@pytest.fixture(scope="module")
def arch_llm(arch_models: dict) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(arch_models["target"]), n_ctx=512, n_batch=512, verbose=False)


# ---------------------------------------------------------------- the rule


def test_capture_rule_table() -> None:
    assert capture.capture_path("llama") == "tap"
    assert capture.capture_path("qwen3") == "tap"
    for arch in ("qwen2", "gemma3", "phi3", "granite", "olmo2", "starcoder2"):
        assert capture.capture_path(arch) == "callback"
    # taps: inputs 1..n_layer-1 (a few architectures also n_layer); the callback: 1..n_layer
    assert capture.tappable_layers("llama", 30) == range(1, 30)
    assert capture.tappable_layers("deepseek4", 30) == range(1, 31)
    assert capture.tappable_layers("qwen2", 24) == range(1, 25)
    assert capture.tappable_layers("llama", 30, "callback") == range(1, 31)
    with pytest.raises(capture.CaptureError, match="no layer-input taps"):
        capture.tappable_layers("qwen2", 24, "tap")


def test_converter_follows_the_capture_path(tmp_path: Path, arch_models: dict, capsys) -> None:
    # the fixture's drafter taps the last layer's output: no warning on a callback target
    out = tmp_path / "d.gguf"
    assert convert_main([str(arch_models["ckpt"]), "--target", str(arch_models["target"]), "-o", str(out),
                         "--no-progress"]) == 0
    assert "last layer" not in capsys.readouterr().err
    llama_target = testing.make_target_gguf(tmp_path / "llama.gguf")
    assert convert_main([str(arch_models["ckpt"]), "--target", str(llama_target), "-o", str(out), "--force",
                         "--no-progress"]) == 0
    assert "warning: target layer id 3 is the target's last layer" in capsys.readouterr().err


# ---------------------------------------------------------------- any-arch targets


def test_plain_llama_cpp_decoding_works(arch_models: dict, arch_llm: llama_cpp.Llama) -> None:
    assert arch_llm.metadata["general.architecture"] == arch_models["arch"]
    toks = greedy_generate(arch_llm, PROMPTS[0], 12)
    assert len(toks) == 12
    assert all(0 <= t < arch_llm.n_vocab() for t in toks)


def test_greedy_is_lossless(arch_models: dict, arch_llm: llama_cpp.Llama) -> None:
    refs = {p: greedy_generate(arch_llm, p, 20) for p in PROMPTS}
    runs = {p: plain_run(arch_llm, arch_llm.tokenize(p.encode(), add_bos=True, special=True), 20) for p in PROMPTS}
    exact = exactness.llama_invariance(arch_llm).batch_invariant
    drafted = 0
    for n_max in (2, 7):
        with Speculator(arch_llm, arch_models["drafter"], n_max=n_max) as spec:
            assert spec.capture_path == "callback"
            for p in PROMPTS:
                out = spec.generate(p, max_tokens=20, chat=False)
                # identical on batch-invariant builds, else parting only at a near-tie
                check_greedy(out.tokens, runs[p], exact=exact, what=(n_max, p))
                drafted += sum(out.stats["drafted_per_position"])
    assert drafted > 0
    # the Llama passed in kept its own context and still decodes as before
    assert greedy_generate(arch_llm, PROMPTS[0], 20) == refs[PROMPTS[0]]


def test_target_given_as_path_gets_its_context_replaced(arch_models: dict, arch_llm: llama_cpp.Llama) -> None:
    ref = greedy_generate(arch_llm, PROMPTS[1], 16)
    with Speculator(str(arch_models["target"]), arch_models["drafter"], n_ctx=512, n_max=4) as spec:
        assert spec._capturing is not None and spec._capturing.context is spec.llm._ctx  # no second KV cache
        assert spec.generate(PROMPTS[1], max_tokens=16, chat=False).tokens == ref
        # the Llama's own API runs through the replaced context too
        assert greedy_generate(spec.llm, PROMPTS[1], 16) == ref


def test_stream_with_rollbacks_keeps_features_in_step(arch_models: dict, arch_llm: llama_cpp.Llama) -> None:
    """After a stream with many rejected drafts (each one a target cache rollback), the
    drafter cache the engine filled must equal one filled from a fresh capture of the
    whole committed prefix: same proposal for the next block. A stream whose features
    slipped by one row proposes differently (checked at the end)."""
    prompt = "The quick brown fox"
    with Speculator(arch_llm, arch_models["drafter"], n_max=5) as spec:
        pieces = list(spec.stream(prompt, max_tokens=40, chat=False))
        out = spec.last
        st = out.stats
        assert "".join(pieces) == out.text
        assert sum(st["drafted_per_position"]) > sum(st["accepted_per_position"])  # rollbacks happened
        tokens = spec.tokenize_prompt(prompt, chat=False) + out.tokens
        d = spec.drafter
        assert d is not None
        last = d.last_pos
        assert d.n_cached == last + 1 and last + 1 < len(tokens)
        engine_prop = d.propose(tokens[last + 1], last + 1)

    fresh_llm = llama_cpp.Llama(str(arch_models["target"]), n_ctx=512, n_batch=512, verbose=False)
    cc = capture.capturing_context(fresh_llm)
    try:
        layers = [i + 1 for i in LAYER_IDS]
        feats = cc.features(tokens[: last + 1], layers)
    finally:
        cc.close()
    with Drafter(arch_models["drafter"], arch_models["target"], n_ctx=512) as fresh:
        fresh.inject(feats, list(range(last + 1)))
        fresh_prop = fresh.propose(tokens[last + 1], last + 1)
        fresh.truncate(0)
        fresh.inject(np.roll(feats, 1, axis=0), list(range(last + 1)))  # features one row late
        slipped = fresh.propose(tokens[last + 1], last + 1)
    np.testing.assert_array_equal(engine_prop.candidates, fresh_prop.candidates)
    np.testing.assert_allclose(engine_prop.scores, fresh_prop.scores, rtol=1e-3, atol=1e-3)
    assert not np.allclose(slipped.scores, fresh_prop.scores, rtol=1e-3, atol=1e-3)


def _drive(engine, jobs: dict[int, list[int]], n: int, *, late: tuple[int, ...] = ()) -> dict[int, list[int]]:
    """Runs prompts on the BatchEngine's slots ({slot: prompt tokens}) until each has
    committed n tokens or an EOS; slots in `late` join two steps after the others.
    Returns every token each slot committed (a step may commit a few past n or EOS)."""
    vocab = llama_cpp.llama_model_get_vocab(engine.llm._model.model)
    out: dict[int, list[int]] = {s: [] for s in jobs}
    done: set[int] = set()
    for s, toks in jobs.items():
        if s not in late:
            engine.start(s, toks)
    step = 0
    while len(done) < len(jobs):
        step += 1
        if step == 3:
            for s in late:
                engine.start(s, jobs[s])
        for s, got in enumerate(engine.step()):
            if s not in jobs:
                continue
            assert got is not None, "context full"
            out[s] += got  # a finished slot goes on decoding until stopped: keep its tokens in step
            if len(out[s]) >= n or any(llama_cpp.llama_vocab_is_eog(vocab, t) for t in out[s]):
                done.add(s)
    return out


def _answer(engine, committed: list[int], n: int) -> list[int]:
    """The answer a client gets: up to n tokens, cut before the first EOS."""
    vocab = llama_cpp.llama_model_get_vocab(engine.llm._model.model)
    end = next((i for i, t in enumerate(committed) if llama_cpp.llama_vocab_is_eog(vocab, t)), len(committed))
    return committed[: min(n, end)]


def test_batch_engine_slots_are_lossless_and_features_stay_per_slot(arch_models: dict,
                                                                    arch_llm: llama_cpp.Llama) -> None:
    """The server's BatchEngine on a target without taps: the callback captures the
    rows of all slots verifying in one decode. Each slot's answer equals the one it
    gets alone and plain greedy decoding; and each slot's drafter cache holds its own
    features, in order: it proposes what a drafter fed a fresh capture of that slot's
    committed prefix proposes (rows of another slot, or shifted rows, would not)."""
    from pydflash2.server.engine import BatchEngine

    prompts = PROMPTS[:4]
    toks = [arch_llm.tokenize(p.encode(), add_bos=True, special=True) for p in prompts]
    runs = [plain_run(arch_llm, t, 20) for t in toks]
    exact = exactness.llama_invariance(arch_llm).batch_invariant
    engine = BatchEngine(arch_models["target"], arch_models["drafter"], n_slots=4, n_ctx=256, n_max=3,
                         flash_attn=False)  # as the reference contexts below
    try:
        sequential = {}
        for i, t in enumerate(toks):
            sequential[i] = _answer(engine, _drive(engine, {0: t}, 20)[0], 20)
            engine.stop(0)
        before = engine.stats()
        committed = _drive(engine, dict(enumerate(toks)), 20, late=(3,))
        st = engine.stats()
        for i in range(len(prompts)):
            concurrent = _answer(engine, committed[i], 20)
            if exact:
                assert concurrent == sequential[i], i
            check_greedy(concurrent, runs[i], exact=exact, what=("concurrent", i))
            check_greedy(sequential[i], runs[i], exact=exact, what=("sequential", i))
        # several slots verified in one decode, and drafts were accepted
        assert st["n_rows"] - before["n_rows"] > 4 * (st["n_steps"] - before["n_steps"]) / 2
        assert st["n_accepted"] > before["n_accepted"]

        fresh_llm = llama_cpp.Llama(str(arch_models["target"]), n_ctx=512, n_batch=512, verbose=False)
        cc = capture.capturing_context(fresh_llm)
        props = []
        try:
            for i, d in enumerate(engine.drafters):
                seq = toks[i] + committed[i]
                last = d.last_pos
                assert d.n_cached == last + 1 and last + 1 < len(seq)
                feats = cc.features(seq[: last + 1], [lid + 1 for lid in LAYER_IDS])
                cc.context.kv_cache_clear()
                with Drafter(arch_models["drafter"], arch_models["target"], n_ctx=512) as fresh:
                    fresh.inject(feats, list(range(last + 1)))
                    want = fresh.propose(seq[last + 1], last + 1)
                    fresh.truncate(0)
                    fresh.inject(np.roll(feats, 1, axis=0), list(range(last + 1)))
                    slipped = fresh.propose(seq[last + 1], last + 1)
                got = d.propose(seq[last + 1], last + 1)
                np.testing.assert_array_equal(got.candidates, want.candidates)
                if exact:
                    assert np.array_equal(got.scores.view(np.uint32), want.scores.view(np.uint32)), i
                else:  # the stock build's verify batches round unlike one prompt batch (measured: <= 0.02)
                    np.testing.assert_allclose(got.scores, want.scores, rtol=0, atol=0.1)
                assert np.abs(slipped.scores - want.scores).max() > 0.5  # misplaced rows show
                props.append(want.scores)
        finally:
            cc.close()
        assert not np.allclose(props[0], props[1], rtol=1e-3, atol=1e-3)  # the slots' features do differ
    finally:
        engine.close()


# ---------------------------------------------------------------- the two paths agree


def _both_paths(llm: llama_cpp.Llama, layers: list[int], tokens: list[int], pos0: int,
                cc: capture.CapturingContext, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
    """One decode on a context that has the taps on and the callback armed: (taps, callback)."""
    from llama_cpp import _internals

    H = llm.n_embd()
    batch = _internals.LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=1, verbose=False)
    batch.set_batch(tokens, pos0, all_logits)
    cc.capture.arm(layers, H, len(tokens))
    try:
        cc.context.decode(batch)
    finally:
        cc.capture.disarm()
        batch.close()
    cc.capture.check("llama")
    taps = np.stack([np.ctypeslib.as_array(ext.get_embeddings_layer_inp(cc.ctx, lid), shape=(len(tokens), H)).copy()
                     for lid in layers])
    cb = np.stack([cc.capture.rows(lid) for lid in layers])
    return taps, cb


def _assert_paths_agree(target: Path, n_prompt: int) -> None:
    llm = llama_cpp.Llama(str(target), n_ctx=512, n_batch=512, verbose=False)
    cc = capture.capturing_context(llm)
    try:
        layers = list(capture.tappable_layers("llama", llama_cpp.llama_model_n_layer(llm._model.model)))
        for lid in layers:
            ext.set_embeddings_layer_inp(cc.ctx, lid, True)
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(20, llm.n_vocab(), n_prompt)]
        taps, cb = _both_paths(llm, layers, prompt, 0, cc, all_logits=False)  # prompt batch
        assert np.array_equal(taps.view(np.uint32), cb.view(np.uint32))
        for B in (1, 8):  # verify batches after the prompt (every row outputs logits)
            block = [int(t) for t in rng.integers(20, llm.n_vocab(), B)]
            taps, cb = _both_paths(llm, layers, block, n_prompt, cc, all_logits=True)
            assert np.array_equal(taps.view(np.uint32), cb.view(np.uint32)), B
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(cc.ctx), 0, n_prompt, -1)
        assert np.abs(cb).max() > 0
    finally:
        for lid in range(1, llama_cpp.llama_model_n_layer(llm._model.model)):
            ext.set_embeddings_layer_inp(cc.ctx, lid, False)
        cc.close()


def test_callback_equals_taps_bit_for_bit_tiny(target_gguf: Path) -> None:
    _assert_paths_agree(target_gguf, 37)


def test_callback_equals_taps_bit_for_bit_smollm2() -> None:
    _assert_paths_agree(testing.default_target(), 64)


def test_engine_callback_path_equals_tap_path_on_llama(tmp_path: Path) -> None:
    """The engine itself on a llama target, forced onto each path: same tokens, same
    acceptance, and a drafter cache that proposes bit for bit the same next block
    (the drafter was fed the same features)."""
    target = testing.make_target_gguf(tmp_path / "t.gguf", testing.TargetSpec(hot_tokens=HOT))
    ckpt = testing.make_drafter_checkpoint(tmp_path / "hf", target, testing.DrafterSpec(target_layer_ids=(0, 1, 2)))
    drafter = testing.checkpoint_to_gguf(ckpt, target, tmp_path / "d.gguf")
    llm = llama_cpp.Llama(str(target), n_ctx=512, n_batch=512, verbose=False)
    runs = {}
    for path in ("tap", "callback"):
        with Speculator(llm, drafter, n_max=5, capture=path) as spec:
            assert spec.capture_path == path
            out = spec.generate(PROMPTS[0], max_tokens=24, chat=False)
            d = spec.drafter
            assert d is not None
            tokens = spec.tokenize_prompt(PROMPTS[0], chat=False) + out.tokens
            prop = d.propose(tokens[d.last_pos + 1], d.last_pos + 1)
            runs[path] = (out.tokens, out.stats["accepted_per_position"], d.last_pos, prop.candidates, prop.scores)
    tap, cb = runs["tap"], runs["callback"]
    assert tap[:3] == cb[:3]
    np.testing.assert_array_equal(tap[3], cb[3])
    assert np.array_equal(tap[4].view(np.uint32), cb[4].view(np.uint32))


# ---------------------------------------------------------------- refusals


def test_last_layer_output_follows_the_capture_path(tmp_path: Path, target_gguf: Path) -> None:
    """On a llama target the taps stop at input n_layer-1; the callback also gives n_layer."""
    spec = testing.DrafterSpec(target_layer_ids=LAYER_IDS)
    ckpt = testing.make_drafter_checkpoint(tmp_path / "hf", target_gguf, spec)
    drafter = testing.checkpoint_to_gguf(ckpt, target_gguf, tmp_path / "d.gguf")
    llm = llama_cpp.Llama(str(target_gguf), n_ctx=256, n_batch=256, verbose=False)
    with pytest.raises(GenerationError, match=r"input 4 .* through the tap path: 1\.\.3"):
        Speculator(llm, drafter, n_max=3)
    ref = greedy_generate(llm, PROMPTS[2], 12)
    with Speculator(llm, drafter, n_max=3, capture="callback") as spec:
        assert spec.generate(PROMPTS[2], max_tokens=12, chat=False).tokens == ref


def test_tap_path_on_an_arch_without_taps_is_refused(arch_models: dict, arch_llm: llama_cpp.Llama) -> None:
    with pytest.raises(GenerationError, match="does not expose layer inputs"):
        Speculator(arch_llm, arch_models["drafter"], n_max=3, capture="tap")


def test_missing_layer_output_is_named_not_an_abort(arch_models: dict, arch_llm: llama_cpp.Llama) -> None:
    """Crafted: no architecture of the pinned llama.cpp that can be a target lacks
    l_out (tools/audit_layer_outputs.py), so ask for the output of a layer the
    graph does not have (l_out-4 of a 4-layer target)."""
    cc = capture.capturing_context(arch_llm)
    try:
        with pytest.raises(capture.CaptureError, match=r"names no tensor 'l_out-4'.*input of layer 5"):
            cc.features([5, 6, 7], [2, 5])
        # the last layer's output exists only for rows that output logits: asked on a batch
        # that outputs only its last row, the shape is reported, not copied out of bounds
        from llama_cpp import _internals

        batch = _internals.LlamaBatch(n_tokens=4, embd=0, n_seq_max=1, verbose=False)
        batch.set_batch([5, 6, 7, 8], 3, False)
        cc.capture.arm([4], arch_llm.n_embd(), 4)
        cc.context.decode(batch)
        cc.capture.disarm()
        batch.close()
        with pytest.raises(capture.CaptureError, match=r"'l_out-3'.*shape \[64, 1, 1, 1\]"):
            cc.capture.check(arch_models["arch"])
        # and the context keeps working
        assert cc.features([5, 6, 7], [1, 4], pos0=7).shape == (3, 2 * arch_llm.n_embd())
    finally:
        cc.close()


def test_capture_on_a_context_without_the_callback_says_so(arch_llm: llama_cpp.Llama) -> None:
    from llama_cpp import _internals

    cap = capture.CallbackCapture()
    batch = _internals.LlamaBatch(n_tokens=3, embd=0, n_seq_max=1, verbose=False)
    batch.set_batch([5, 6, 7], 0, False)
    cap.arm([2], arch_llm.n_embd(), 3)
    arch_llm._ctx.kv_cache_clear()
    arch_llm._ctx.decode(batch)  # the Llama's own context: made without our callback
    cap.disarm()
    batch.close()
    arch_llm._ctx.kv_cache_clear()
    arch_llm.reset()
    with pytest.raises(capture.CaptureError, match="not created with this capture's evaluation callback"):
        cap.check()
