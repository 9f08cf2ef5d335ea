"""Exact speculative decoding: bit-identical to plain decoding on a batch-invariant
llama-cpp-python (CI's special tier builds one with GGML_LLAMAFILE=OFF), and a
clear refusal, before anything is loaded, everywhere else."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import pydflash2_testing as testing
import pytest
from conftest import require_build_feature
from lossless import check_greedy, plain_greedy
from pydflash2.convert.cli import main as convert_main
from pydflash2_testing import teacher_forcing
from server_process import ServerProcess

import pydflash2
from pydflash2 import Speculator, exactness, native_info
from pydflash2.exactness import INSTALL_COMMAND, ExactnessUnavailable
from pydflash2.models import default_drafter
from pydflash2.speculator import load_target

pytestmark = pytest.mark.build  # every claim here changes with the build (tier 2)

INFO = native_info()
INVARIANT = bool(INFO["batch_invariant"])

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
PROMPTS = [
    "Once upon a time", "The answer is", "def main():", "Hello", "A small drafter", "Water boils at",
    "The capital of France", "It learned to guess", "quick brown", "Speculative decoding drafts",
    "print('hello world')", "and when it guessed right", "The target model verifies", "everyone was happy",
    "100 degrees", "lazy dog", "a block of tokens", "the longest correct prefix", "Paris", "42",
]
N_MAXES: list[int | str] = [1, 2, 3, 4, 5, 6, 7, "auto"]


def test_native_info_reports_batch_invariance() -> None:
    assert isinstance(INFO["batch_invariant"], bool)
    assert isinstance(INFO["llamafile"], bool)
    assert (INFO["batch_invariant_reason"] == "") == INFO["batch_invariant"]
    if INFO["llamafile"]:
        assert not INFO["batch_invariant"] and "llamafile" in INFO["batch_invariant_reason"]
    # llama.cpp's own report of the CPU backend agrees on llamafile
    assert ("LLAMAFILE = 1" in INFO["llama_system_info"]) == INFO["llamafile"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("pydflash2")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "pydflash2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def test_info_command_shows_the_build_kind(tmp_path) -> None:
    r = _cli("info", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("batch-invariant: yes" if INVARIANT else "batch-invariant: no") in r.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("exact")
    target = testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=HOT))
    v2 = testing.make_drafter_checkpoint(d / "v2-hf", target, testing.DrafterSpec(version=2))
    assert convert_main([str(v2), "--target", str(target), "-o", str(d / "v2-converted.gguf")]) == 0
    return {"target": target, "random": testing.checkpoint_to_gguf(v2, target, d / "v2.gguf"),
            "converted": d / "v2-converted.gguf"}


# ---------------------------------------------------------------- stock builds


def test_exact_is_refused_before_loading_on_a_non_invariant_build(tmp_path) -> None:
    if INVARIANT:
        pytest.skip("this build is batch-invariant: exact mode is available")
    # not a GGUF at all: refusing before loading anything means it is never read
    junk = tmp_path / "not-a-model.gguf"
    junk.write_bytes(b"\0" * 64)
    with pytest.raises(ExactnessUnavailable) as e:
        Speculator(junk, junk, exact=True)
    msg = str(e.value)
    assert INSTALL_COMMAND in msg and INFO["batch_invariant_reason"] in msg
    assert "--no-cache-dir --force-reinstall" in INSTALL_COMMAND


def test_exact_flag_is_refused_by_the_cli_on_a_non_invariant_build(tmp_path, tiny) -> None:
    if INVARIANT:
        pytest.skip("this build is batch-invariant: exact mode is available")
    r = _cli("generate", "hi", "--model", str(tiny["target"]), "--draft", str(tiny["random"]), "--exact",
             cwd=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and INSTALL_COMMAND in r.stderr
    r = _cli("bench", "--model", str(tiny["target"]), "--draft", str(tiny["random"]), "--exact",
             "--out", str(tmp_path / "bench"), cwd=tmp_path)
    assert r.returncode == 2 and INSTALL_COMMAND in r.stderr


# ---------------------------------------------------------------- invariant builds


def _require_invariant() -> None:
    require_build_feature(INVARIANT, f"batch-invariant kernels ({INFO['batch_invariant_reason']})")


@pytest.mark.parametrize("drafter", ["random", "converted"])
def test_exact_equals_plain_decoding_on_the_tiny_target(tiny, drafter) -> None:
    _require_invariant()
    n_tokens = 96
    llm, inv = load_target(tiny["target"], n_ctx=512, n_threads=1, exact=True)
    assert inv.batch_invariant, inv.reason
    plain = {p: plain_greedy(llm, llm.tokenize(p.encode(), add_bos=True, special=True), n_tokens) for p in PROMPTS}
    equal = accepted = 0
    for n_max in N_MAXES:
        with Speculator(llm, tiny[drafter], n_max=n_max, exact=True) as spec:
            for p in PROMPTS:
                out = spec.generate(p, max_tokens=n_tokens, chat=False)
                check_greedy(out.tokens, plain[p], exact=True, what=(drafter, n_max, p))
                assert out.stats["exact"] is True
                equal += 1
                accepted += sum(out.stats["accepted_per_position"])
    assert equal == len(PROMPTS) * len(N_MAXES)
    assert accepted > 50  # verify batches committed drafts, so batched rows were compared too


def _dev_prompts(n: int) -> list[str]:
    """The first n held-out prompts of the training issue's dev set (never trained on)."""
    path = Path(pydflash2.__file__).parent / "data" / "prompts_dev.txt"
    return [line.strip() for line in path.read_text().splitlines() if line.strip()][:n]


def _smollm2_exact() -> tuple[llama_cpp.Llama, Path]:
    _require_invariant()
    target = testing.default_target_or_skip()
    llm, inv = load_target(target, n_ctx=1024, n_threads=1, exact=True)
    assert inv.batch_invariant, inv.reason
    return llm, target


@pytest.mark.slow  # SmolLM2-scale: tier 2 runs it (`slow and build`)
def test_smollm2_forward_is_batch_invariant() -> None:
    """The claim exact mode rests on, teacher-forced on SmolLM2 as exact mode loads it: at every
    position of plain greedy decoding, row 0 of a batch of B = 2..8 rows ([token, junk...], the
    K/V that those batches wrote kept, the junk cut off) has bit-identical logits to the batch-1
    row. Stronger than equal tokens: no position may differ in any bit, near-tie or not."""
    llm, _ = _smollm2_exact()
    dec = teacher_forcing.RawDecoder(llm)
    rng = np.random.default_rng(0)
    try:
        for p in _dev_prompts(2):
            ids = llm.tokenize(p.encode(), add_bos=True, special=True)
            ref, ref_rows = teacher_forcing.reference(dec, ids, 40)
            for b in range(2, 9):
                rows = teacher_forcing.batched(dec, ids, ref, b, rng)
                for i, (x, y) in enumerate(zip(ref_rows, rows, strict=True)):
                    assert np.array_equal(x, y), (p, b, i, float(np.max(np.abs(x - y))))
    finally:
        dec.close()
        llm.close()


@pytest.mark.slow  # SmolLM2-scale: tier 2 runs it (`slow and build`)
def test_exact_equals_plain_decoding_on_smollm2() -> None:
    """8 held-out chat prompts x n_max 1, 7 and auto x 64 tokens with the shipped (trained,
    converted) drafter, so drafts are accepted and verify batches commit them."""
    llm, _ = _smollm2_exact()
    draft = default_drafter()
    assert draft is not None, "the shipped drafter is missing from this install"
    prompts_text = _dev_prompts(8)
    n_tokens = 64
    with Speculator(llm, draft, n_max=0) as spec:  # chat-template tokens, as generate() makes them
        prompts = {p: spec.tokenize_prompt(p) for p in prompts_text}
    plain = {p: plain_greedy(llm, ids, n_tokens) for p, ids in prompts.items()}
    accepted = 0
    for n_max in (1, 7, "auto"):
        with Speculator(llm, draft, n_max=n_max, exact=True) as spec:
            for p in prompts_text:
                out = spec.generate(p, max_tokens=n_tokens)
                check_greedy(out.tokens, plain[p], exact=True, what=(n_max, p))
                assert out.stats["exact"] is True
                accepted += sum(out.stats["accepted_per_position"])
    assert accepted > 50  # drafts were committed: batched verify rows were compared too


def test_exact_cli_runs_on_an_invariant_build(tmp_path, tiny) -> None:
    _require_invariant()
    r = _cli("generate", "Once upon a time", "--model", str(tiny["target"]), "--draft", str(tiny["random"]),
             "--exact", "--raw", "--n-max", "4", "--max-tokens", "32", "--n-ctx", "256", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stats"]["exact"] is True
    llm = llama_cpp.Llama(str(tiny["target"]), n_ctx=256, verbose=False)
    ref = plain_greedy(llm, llm.tokenize(b"Once upon a time", add_bos=True, special=True), 32)
    check_greedy(out["tokens"], ref, exact=True)


def _q4_0(target: Path, out: Path) -> Path:
    """The target requantized by llama.cpp's own quantizer to Q4_0, which the CPU backend repacks on
    AVX2 and ARM dot-product CPUs: those weights switch to a gemm kernel from 4 batch rows."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    assert llama_cpp.llama_model_quantize(str(target).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


def test_target_weights_report_repacking(tmp_path, tiny) -> None:
    q = _q4_0(tiny["target"], tmp_path / "q4_0.gguf")
    w = exactness.target_weights(q)
    assert w["types"].get("q4_0", 0) > 0
    f32 = exactness.target_weights(tiny["target"])
    assert f32["repacked"] == {}
    if w["repacked"]:
        # repacked weights switch to a gemm kernel from 4 batch rows: exact mode verifies at most 3
        inv = exactness.target_invariance(q, flash_attn=False, n_ctx=512)
        assert inv.max_batch == 3 or not INVARIANT
        if INVARIANT:
            llm, inv = load_target(q, n_ctx=256, n_threads=1, exact=True)
            with Speculator(llm, tiny["random"], n_max=7, exact=True) as spec:
                assert spec.max_draft == 2
                out = spec.generate("Once upon a time", max_tokens=24, chat=False)
                assert out.stats["exact"] is True
            with Speculator(llm, tiny["random"], n_max=7) as spec:
                assert spec.generate("Hello", max_tokens=4, chat=False).stats["exact"] is False


def test_serve_exact_caps_a_target_whose_kernels_switch(tmp_path, tiny) -> None:
    """serve --exact takes Speculator(exact=True)'s checks and caps: with a target whose matmul
    kernels switch at 4 batch rows (repacked Q4_0) it verifies at most 3 rows whatever --n-max asks,
    and its greedy answers, two slots at once, are plain greedy decoding's token for token."""
    _require_invariant()
    q = _q4_0(tiny["target"], tmp_path / "q4_0.gguf")
    if not exactness.target_weights(q)["repacked"]:
        pytest.skip("this CPU does not repack Q4_0 weights: no kernel switch to cap")
    server = ServerProcess(["--model", str(q), "--draft", str(tiny["random"]), "--exact", "--n-max", "7",
                            "--parallel", "2", "--n-ctx", "256", "--threads", "1"], tmp_path)
    try:
        def complete(prompt: str) -> list[int]:
            r = httpx.post(server.url + "/v1/completions", timeout=120, json={
                "prompt": prompt, "max_tokens": 24, "temperature": 0, "return_token_ids": True})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

        with ThreadPoolExecutor(2) as pool:
            answers = dict(zip(PROMPTS[:6], pool.map(complete, PROMPTS[:6]), strict=True))
        m = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    # the per-position counters have one entry per draft the engine may verify: the cap, 3 rows - 1
    positions = {line.split('position="')[1].split('"')[0] for line in m.splitlines()
                 if line.startswith("pydflash2:spec_decode_num_accepted_tokens_per_pos_total{")}
    assert positions == {"0", "1"}, positions
    llm = llama_cpp.Llama(str(q), n_ctx=256, n_threads=1, verbose=False)
    for p, got in answers.items():
        ids = llm.tokenize(p.encode(), add_bos=True, special=True)
        check_greedy(got, plain_greedy(llm, ids, 24), exact=True, what=p)
    llm.close()


# A tiny gemma3 as Gemma 3 models are: sliding-window attention (5 layers of 6), and Q4_K_M weights, whose
# matmul kernels switch with the batch (repacked q4_K: gemm from 4 rows; q6_K: tiled from 8), so a row's
# numbers depend on the shape of the batch it is decoded in. Its logits spread over a few units (near-ties
# as a trained model's), so a row decoded in another shape than plain decoding's changes greedy tokens.
GEMMA_SPEC = testing.TargetSpec(arch="gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=1, n_ff=512,
                                sliding_window=16, head_scale=0.02)
# prompts sharing prefixes, as the server reuses them
GEMMA_PROMPTS = ["Once upon a time", "Once upon a time there was a little model", "The answer is 42.",
                 "The answer is", "The quick brown fox jumps over the lazy dog.", "The capital of France is Paris.",
                 "def main():", "def main():\n    print('hello world')"]


@pytest.fixture(scope="module")
def gemma_q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("exact-gemma")
    f32 = testing.make_target_gguf(d / "f32.gguf", GEMMA_SPEC)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    target = d / "q4_k_m.gguf"
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(target).encode(), ctypes.byref(params)) == 0
    return {"target": target, "random": testing.make_random_drafter_for(target, d / "dflash2.gguf")}


def test_serve_exact_equals_plain_decoding_where_kernels_switch_with_the_batch(tmp_path, gemma_q4_k_m) -> None:
    """serve --exact decodes every row in the batch shape plain decoding gives it, on a target whose
    kernels switch with the batch: a prompt is prefilled whole from position 0 (not after a reused
    prefix: that moved rows between the gemm and gemv kernels), and two slots' verify rows never share
    a decode beyond the invariant batch (2 x 3 rows took the gemm kernel). Greedy answers, one at a
    time (the slot holding the longest prefix serves each) and two at once, are fresh plain greedy
    decoding's token for token. (Without those rules 7 of these 16 answers left plain decoding.)"""
    _require_invariant()
    target = gemma_q4_k_m["target"]
    inv = exactness.target_invariance(target, flash_attn=False, n_ctx=512)
    assert inv.max_batch is not None and inv.max_batch < 7, inv  # kernels switch within 2 slots' verify rows
    n_tokens = 48
    server = ServerProcess(["--model", str(target), "--draft", str(gemma_q4_k_m["random"]), "--exact",
                            "--n-max", "7", "--parallel", "2", "--n-ctx", "256", "--threads", "1"], tmp_path)
    try:
        def complete(prompt: str) -> list[int]:
            r = httpx.post(server.url + "/v1/completions", timeout=120, json={
                "prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "return_token_ids": True})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

        one_at_a_time = {p: complete(p) for p in GEMMA_PROMPTS}
        with ThreadPoolExecutor(2) as pool:
            pairs = [(a, b) for a, b in zip(GEMMA_PROMPTS[::2], GEMMA_PROMPTS[1::2], strict=True)]
            two_at_once = [dict(zip(pair, pool.map(complete, pair), strict=True)) for pair in pairs]
    finally:
        server.stop()
    llm = llama_cpp.Llama(str(target), n_ctx=256, n_threads=1, verbose=False)
    plain = {p: plain_greedy(llm, llm.tokenize(p.encode(), add_bos=True, special=True), n_tokens)
             for p in GEMMA_PROMPTS}
    llm.close()
    for p, got in one_at_a_time.items():
        check_greedy(got, plain[p], exact=True, what=("one at a time", p))
    for answers in two_at_once:
        for p, got in answers.items():
            check_greedy(got, plain[p], exact=True, what=("two at once", p))
