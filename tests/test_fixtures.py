"""The generated fixtures are real: llama.cpp runs the target, the drafter
checkpoints follow the published Hugging Face layout."""

from __future__ import annotations

import json

import llama_cpp
import ml_dtypes
import numpy as np
import pydflash2_testing as testing
from safetensors import safe_open


def test_target_loads_tokenizes_and_generates(target_gguf) -> None:
    llm = llama_cpp.Llama(str(target_gguf), n_ctx=256, verbose=False)
    assert llm.n_vocab() == len(testing.make_vocab(testing.TargetSpec().n_merges)[0])
    text = "The quick brown fox jumps over the lazy dog."
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    assert len(ids) > 3
    assert llm.detokenize(ids).decode() == text
    # special tokens are recognised as single control tokens
    assert llm.tokenize(b"<|im_start|>", add_bos=False, special=True) == [1]
    out = llm("Once upon a time", max_tokens=8, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1
    chat = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0)
    assert chat["choices"][0]["message"]["role"] == "assistant"


def test_target_greedy_decoding_is_deterministic(target_gguf) -> None:
    llm = llama_cpp.Llama(str(target_gguf), n_ctx=256, verbose=False)
    a = llm("The answer is", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    b = llm("The answer is", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    assert a == b and a


def test_dflash2_checkpoint_layout(drafter2_ckpt) -> None:
    cfg = json.loads((drafter2_ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    dc = cfg["dflash_config"]
    assert {"block_size", "mask_token_id", "target_layer_ids", "conv_kernel_size", "conv_group_size",
            "selector_rank", "selector_top_k"} <= set(dc)
    H, V, K = cfg["hidden_size"], cfg["vocab_size"], dc["conv_kernel_size"]
    G = H // dc["conv_group_size"]
    with safe_open(str(drafter2_ckpt / "model.safetensors"), framework="np") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").shape == (H, len(dc["target_layer_ids"]) * H)
        assert f.get_tensor("fc.weight").dtype == ml_dtypes.bfloat16
        assert f.get_tensor("layers.0.attention_conv.base_kernel").shape == (2, K, H)
        assert f.get_tensor("layers.1.mlp_conv.kernel_projection.weight").shape == (2 * K * G, H)
        assert f.get_tensor("candidate_selector.predecessor_codebook").shape == (V, dc["selector_rank"])
        assert f.get_tensor("candidate_selector.hidden_projection.weight").shape == (dc["selector_rank"], H)
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names
    assert "candidate_selector.successor_codebook" in names


def test_dflash1_checkpoint_has_no_v2_parts(drafter1_ckpt) -> None:
    cfg = json.loads((drafter1_ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert "selector_top_k" not in cfg["dflash_config"]
    with safe_open(str(drafter1_ckpt / "model.safetensors"), framework="np") as f:
        assert not [n for n in f.keys() if "conv" in n or "selector" in n]


def test_sharded_checkpoint_round_trips(tmp_path, target_gguf) -> None:
    one = testing.make_drafter_checkpoint(tmp_path / "one", target_gguf, dtype="f32")
    three = testing.make_drafter_checkpoint(tmp_path / "three", target_gguf, dtype="f32", shards=3)
    index = json.loads((three / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    a = dict(testing.iter_checkpoint_tensors(one))
    b = dict(testing.iter_checkpoint_tensors(three))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_cpu_hogs_spin_and_stop() -> None:
    from pydflash2_testing.cpu_hog import CpuHogs

    with CpuHogs(2) as hogs:
        procs = list(hogs._procs)
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.returncode is not None for p in procs) and not hogs._procs


def test_requantized_targets_have_the_type_asked_and_run(tmp_path, target_gguf) -> None:
    """pydflash2_testing.requantized_target (benchmarks/capture_cost.py --requantize): llama.cpp writes
    the target's matrices in the type asked, the copy runs, and a type it does not make is refused."""
    import gguf
    import pytest

    for file_type, want in (("Q4_0", gguf.GGMLQuantizationType.Q4_0), ("Q8_0", gguf.GGMLQuantizationType.Q8_0)):
        out = testing.requantized_target(file_type, target_gguf, tmp_path / f"t.{file_type}.gguf")
        assert testing.requantized_target(file_type, target_gguf, out) == out  # made once
        blocks = {t.tensor_type for t in gguf.GGUFReader(out).tensors if t.name.startswith("blk.") and
                  t.name.endswith("_q.weight")}
        assert blocks == {want}, (file_type, blocks)
        llm = llama_cpp.Llama(str(out), n_ctx=256, verbose=False)
        assert llm("Once upon a time", max_tokens=4, temperature=0.0)["usage"]["completion_tokens"] >= 1
    with pytest.raises(ValueError, match="Q4_1"):
        testing.requantized_target("Q4_1", target_gguf, tmp_path / "no.gguf")
