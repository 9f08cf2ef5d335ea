"""pydflash2.inspect_drafter checks a drafter GGUF against the dflash contract
and never lets a bad file crash the process."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pydflash2_testing as testing
import pytest

from pydflash2 import DrafterFileError, inspect_drafter

U32 = gguf.GGUFValueType.UINT32
STR = gguf.GGUFValueType.STRING

REQUIRED_KEYS = [
    "general.architecture",
    "dflash.block_count",
    "dflash.context_length",
    "dflash.embedding_length",
    "dflash.feed_forward_length",
    "dflash.attention.head_count",
    "dflash.attention.head_count_kv",
    "dflash.attention.layer_norm_rms_epsilon",
    "dflash.rope.freq_base",
    "dflash.block_size",
    "dflash.target_layers",
    "tokenizer.ggml.mask_token_id",
    "dflash.conv_kernel_size",
    "dflash.conv_group_size",
    "dflash.selector_rank",
    "dflash.selector_top_k",
]


def test_dflash2_hyperparameters(drafter2_gguf, drafter2_ckpt) -> None:
    cfg = json.loads((drafter2_ckpt / "config.json").read_text())
    dc = cfg["dflash_config"]
    hp = inspect_drafter(drafter2_gguf)
    assert hp["version"] == 2
    assert hp["n_embd"] == cfg["hidden_size"] == 64
    assert hp["n_layer"] == cfg["num_hidden_layers"]
    assert hp["n_head"] == cfg["num_attention_heads"] and hp["n_head_kv"] == cfg["num_key_value_heads"]
    assert hp["head_dim"] == cfg["head_dim"]
    assert hp["n_ff"] == cfg["intermediate_size"]
    assert hp["n_vocab"] == cfg["vocab_size"] == hp["n_vocab_draft"]
    assert hp["block_size"] == dc["block_size"]
    assert hp["mask_token_id"] == dc["mask_token_id"]
    assert hp["target_layers"] == [i + 1 for i in dc["target_layer_ids"]]
    assert hp["conv_kernel_size"] == dc["conv_kernel_size"]
    assert hp["conv_group_size"] == dc["conv_group_size"]
    assert hp["selector_rank"] == dc["selector_rank"]
    assert hp["selector_top_k"] == dc["selector_top_k"]
    assert hp["rope_freq_base"] == pytest.approx(cfg["rope_theta"])
    assert hp["rms_eps"] == pytest.approx(cfg["rms_norm_eps"])
    assert hp["causal"] is False
    assert not hp["has_token_embd"] and not hp["has_output"] and not hp["has_d2t"]
    assert hp["n_tensors"] == 3 + cfg["num_hidden_layers"] * 15 + 3
    n_params = sum(a.size for _, a in testing.iter_checkpoint_tensors(drafter2_ckpt))
    assert hp["n_params"] == n_params


def test_dflash1_detected(drafter1_gguf) -> None:
    hp = inspect_drafter(drafter1_gguf)
    assert hp["version"] == 1
    assert hp["selector_top_k"] == 0 and hp["conv_kernel_size"] == 0
    assert hp["n_tensors"] == 3 + hp["n_layer"] * 11


def test_missing_file(tmp_path) -> None:
    with pytest.raises(DrafterFileError, match="cannot open"):
        inspect_drafter(tmp_path / "nope.gguf")


@pytest.mark.parametrize("content", [b"", b"GGU", b"not a gguf at all" * 10, bytes(range(256)) * 4])
def test_non_gguf_bytes(tmp_path, content) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(DrafterFileError, match="not a (readable )?GGUF"):
        inspect_drafter(p)


def test_garbage_after_magic(tmp_path) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + bytes([0xFF]) * 200)
    with pytest.raises(DrafterFileError, match="GGUF"):
        inspect_drafter(p)


@pytest.mark.parametrize("fraction", [0.0001, 0.001, 0.01, 0.05, 0.2, 0.5, 0.9, 0.9999])
def test_truncated(tmp_path, drafter2_gguf, fraction) -> None:
    data = drafter2_gguf.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: max(4, int(len(data) * fraction))])
    with pytest.raises(DrafterFileError, match="truncated|not a (readable )?GGUF"):
        inspect_drafter(p)


def test_truncated_by_one_byte(tmp_path, drafter2_gguf) -> None:
    p = tmp_path / "cut.gguf"
    p.write_bytes(drafter2_gguf.read_bytes()[:-1])
    with pytest.raises(DrafterFileError, match="truncated"):
        inspect_drafter(p)


def test_target_model_is_not_a_drafter(target_gguf) -> None:
    with pytest.raises(DrafterFileError, match="general.architecture is 'llama'"):
        inspect_drafter(target_gguf)


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_each_required_key_missing(tmp_path, drafter2_gguf, key) -> None:
    p = testing.rewrite_gguf(drafter2_gguf, tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(DrafterFileError, match=f"missing required metadata key '{key}'"):
        inspect_drafter(p)


def test_vocab_size_missing_everywhere(tmp_path, drafter2_gguf) -> None:
    p = testing.rewrite_gguf(
        drafter2_gguf, tmp_path / "x.gguf", drop_keys=("dflash.vocab_size", "tokenizer.ggml.tokens")
    )
    with pytest.raises(DrafterFileError, match="dflash.vocab_size"):
        inspect_drafter(p)


def _tensor_names(path) -> list[str]:
    return [t.name for t in gguf.GGUFReader(str(path)).tensors]


def test_each_required_tensor_missing(tmp_path, drafter2_gguf) -> None:
    names = _tensor_names(drafter2_gguf)
    assert len(names) == 36
    for name in names:
        p = testing.rewrite_gguf(drafter2_gguf, tmp_path / "x.gguf", drop_tensors=(name,))
        expected = f"missing required tensor '{name}'"
        with pytest.raises(DrafterFileError) as e:
            inspect_drafter(p)
        assert expected in str(e.value), (name, str(e.value))


@pytest.mark.parametrize(
    "name, shape",
    [
        ("fc.weight", (64 * 3, 64)),  # transposed
        ("blk.0.attn_q.weight", (64, 32)),
        ("blk.1.ffn_down.weight", (128, 64)),
        ("blk.0.attn_conv_base", (2, 3, 64)),  # kernel size 3 instead of 2
        ("blk.1.ffn_conv_proj.weight", (15, 64)),
        ("selector_predecessor.weight", (424, 9)),
        ("output_norm.weight", (65,)),
    ],
)
def test_wrong_shape(tmp_path, drafter2_gguf, name, shape) -> None:
    arr = np.zeros(shape, dtype=np.float32)
    p = testing.rewrite_gguf(drafter2_gguf, tmp_path / "x.gguf", replace_tensors={name: arr})
    with pytest.raises(DrafterFileError, match=f"tensor '{name}' has shape"):
        inspect_drafter(p)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("blk.0.attn_norm.weight", np.float16),  # norms must be f32
        ("blk.1.attn_conv_base", np.float16),  # conv base kernels must be f32
        ("fc.weight", np.int32),  # matrices must be float or quantized
        ("selector_successor.weight", np.int8),
    ],
)
def test_wrong_type(tmp_path, drafter2_gguf, name, dtype) -> None:
    r = gguf.GGUFReader(str(drafter2_gguf))
    src = next(t for t in r.tensors if t.name == name)
    arr = np.asarray(src.data).astype(dtype)
    p = testing.rewrite_gguf(drafter2_gguf, tmp_path / "x.gguf", replace_tensors={name: arr})
    with pytest.raises(DrafterFileError, match=f"tensor '{name}' has type"):
        inspect_drafter(p)


def test_unknown_tensor(tmp_path, drafter2_gguf) -> None:
    p = testing.rewrite_gguf(
        drafter2_gguf, tmp_path / "x.gguf", replace_tensors={"blk.0.mystery.weight": np.zeros(4, np.float32)}
    )
    with pytest.raises(DrafterFileError, match="unexpected tensor 'blk.0.mystery.weight'"):
        inspect_drafter(p)


def test_d2t_must_be_int64(tmp_path, drafter2_gguf) -> None:
    good = testing.rewrite_gguf(
        drafter2_gguf,
        tmp_path / "ok.gguf",
        replace_tensors={"d2t": np.arange(424, dtype=np.int64), "output.weight": np.zeros((424, 64), np.float32)},
    )
    hp = inspect_drafter(good)
    assert hp["has_d2t"] and hp["has_output"] and hp["n_vocab_draft"] == 424
    bad = testing.rewrite_gguf(
        drafter2_gguf, tmp_path / "bad.gguf", replace_tensors={"d2t": np.arange(424, dtype=np.float32)}
    )
    with pytest.raises(DrafterFileError, match="tensor 'd2t' has type"):
        inspect_drafter(bad)


@pytest.mark.parametrize(
    "key, value, vtype, match",
    [
        ("general.architecture", "llama", STR, "expected 'dflash'"),
        ("dflash.selector_top_k", 8, U32, "lattice does not fit"),  # 8*9 = 72 > H = 64
        ("dflash.conv_group_size", 24, U32, "not divisible by conv_group_size"),
        ("tokenizer.ggml.mask_token_id", 424, U32, "outside the vocabulary"),
        ("dflash.block_size", 1, U32, "out of range"),
        ("dflash.attention.head_count_kv", 3, U32, "multiple of"),
        ("dflash.vocab_size", 400, U32, "disagrees with tokenizer"),
        ("dflash.block_count", "two", STR, "must be an integer"),
        ("dflash.rope.freq_base", 10000, U32, "must be a float"),
        ("dflash.target_layers", [0, 2], gguf.GGUFValueType.ARRAY, "must be >= 1"),
    ],
)
def test_bad_values(tmp_path, drafter2_gguf, key, value, vtype, match) -> None:
    p = testing.rewrite_gguf(drafter2_gguf, tmp_path / "x.gguf", set_keys={key: (value, vtype)})
    with pytest.raises(DrafterFileError, match=match):
        inspect_drafter(p)


def test_quantized_matrices_are_accepted(tmp_path, drafter2_gguf) -> None:
    r = gguf.GGUFReader(str(drafter2_gguf))
    fc = next(t for t in r.tensors if t.name == "fc.weight")
    q8 = gguf.GGMLQuantizationType.Q8_0
    q = gguf.quants.quantize(np.asarray(fc.data), q8)
    p = testing.rewrite_gguf(drafter2_gguf, tmp_path / "q.gguf", replace_tensors={"fc.weight": (q, q8)})
    assert next(t for t in gguf.GGUFReader(str(p)).tensors if t.name == "fc.weight").tensor_type == q8
    assert inspect_drafter(p)["version"] == 2
