"""pydflash2.convert: HF drafter -> upstream dflash GGUF."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pydflash2_testing as testing
import pytest
from gguf.quants import dequantize
from pydflash2.convert.cli import main as convert_main
from safetensors.numpy import save_file

import pydflash2

GGUF_LAYERS = [i + 1 for i in testing.DrafterSpec().target_layer_ids]  # HF ids + 1


def run(ckpt: Path, target: Path, out: Path, *extra: str) -> int:
    return convert_main([str(ckpt), "--target", str(target), "-o", str(out), "--no-progress", *extra])


def tensors_of(path: Path) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        qt = gguf.GGMLQuantizationType(t.tensor_type)
        data = t.data if qt == gguf.GGMLQuantizationType.I64 else dequantize(t.data, qt)
        out[t.name] = np.asarray(data).reshape(shape)
    return out


def types_of(path: Path) -> dict[str, gguf.GGMLQuantizationType]:
    return {t.name: gguf.GGMLQuantizationType(t.tensor_type) for t in gguf.GGUFReader(str(path)).tensors}


def keys_of(path: Path) -> dict[str, object]:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def conv(tmp_path_factory: pytest.TempPathFactory, drafter2_ckpt: Path, drafter1_ckpt: Path, target_gguf: Path):
    """Converted fixture drafters, cached per (version, outtype)."""
    d = tmp_path_factory.mktemp("conv")
    cache: dict[tuple[int, str], Path] = {}

    def get(version: int, outtype: str = "f32") -> Path:
        if (version, outtype) not in cache:
            out = d / f"v{version}-{outtype}.gguf"
            ckpt = drafter2_ckpt if version == 2 else drafter1_ckpt
            assert run(ckpt, target_gguf, out, "--outtype", outtype) == 0
            cache[(version, outtype)] = out
        return cache[(version, outtype)]

    return get


# ---------------------------------------------------------------- the file itself


@pytest.mark.parametrize("version", [1, 2])
def test_loads_in_libllama_as_dflash(conv, version: int) -> None:
    import ctypes

    from llama_cpp import llama_cpp as lc
    from pydflash2_testing.upstream import ext, silence_logs

    silence_logs()
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(str(conv(version)).encode(), mp)
    assert model, "libllama refused the converted file"
    try:
        buf = ctypes.create_string_buffer(64)
        assert lc.llama_model_meta_val_str(model, b"general.architecture", buf, 64) > 0
        assert buf.value == b"dflash"
        assert ext.dflash_selector_top_k(model) == (4 if version == 2 else 0)
        ids = ext.target_layer_ids(model)
        assert [ids[i] for i in range(ext.target_layer_ids_n(model))] == GGUF_LAYERS
    finally:
        lc.llama_model_free(model)


@pytest.mark.parametrize("version", [1, 2])
def test_inspect_drafter_accepts(conv, version: int) -> None:
    hp = pydflash2.inspect_drafter(str(conv(version)))
    assert hp["architecture"] == "dflash" and hp["version"] == version
    assert hp["target_layers"] == GGUF_LAYERS
    assert hp["mask_token_id"] == testing.MASK_ID
    if version == 2:
        assert (hp["selector_top_k"], hp["selector_rank"], hp["conv_kernel_size"]) == (4, 8, 2)


def test_keys_and_tokenizer(conv, target_gguf: Path) -> None:
    keys = keys_of(conv(2))
    tk = keys_of(target_gguf)
    assert keys["general.architecture"] == "dflash"
    assert keys["dflash.block_size"] == 8 and keys["dflash.selector_top_k"] == 4
    assert keys["tokenizer.ggml.mask_token_id"] == testing.MASK_ID
    assert keys["tokenizer.ggml.tokens"] == tk["tokenizer.ggml.tokens"]
    assert keys["tokenizer.chat_template"] == testing.CHATML_TEMPLATE
    assert "dflash.attention.causal" not in keys


@pytest.mark.parametrize("outtype,tol", [("f32", 0.0), ("bf16", 0.0), ("f16", 2e-3), ("q8_0", 1e-2)])
def test_values_round_trip(conv, drafter2_ckpt: Path, outtype: str, tol: float) -> None:
    out = conv(2, outtype)
    got = tensors_of(out)
    types = types_of(out)
    want = {testing.gguf_tensor_name(n): a for n, a in testing.iter_checkpoint_tensors(drafter2_ckpt)}
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape, name
        if w.ndim == 1 or name.endswith("_conv_base"):
            assert types[name] == gguf.GGMLQuantizationType.F32, name
        if tol == 0.0:  # the checkpoint is bf16: f32 and bf16 are exact
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            np.testing.assert_allclose(g, w, rtol=0, atol=tol * max(1.0, float(np.abs(w).max())), err_msg=name)
    expect = {"f32": "F32", "bf16": "BF16", "f16": "F16", "q8_0": "Q8_0"}[outtype]
    assert types["blk.0.attn_q.weight"].name == expect
    if outtype == "q8_0":  # rank-8 codebook rows cannot hold a 32-wide q8_0 block
        assert types["selector_predecessor.weight"].name == "F16"


def test_matches_independent_writer(conv, drafter2_gguf: Path) -> None:
    ours, ref = conv(2), drafter2_gguf
    a, b = tensors_of(ours), tensors_of(ref)
    assert set(a) == set(b)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    ka = {k: v for k, v in keys_of(ours).items() if not k.startswith("general.")}
    kb = {k: v for k, v in keys_of(ref).items() if not k.startswith("general.")}
    assert ka == kb


def test_sharded_and_f32_input(tmp_path: Path, target_gguf: Path) -> None:
    one = testing.make_drafter_checkpoint(tmp_path / "one", target_gguf, dtype="f32")
    three = testing.make_drafter_checkpoint(tmp_path / "three", target_gguf, dtype="f32", shards=3)
    assert (three / "model.safetensors.index.json").exists()
    assert run(one, target_gguf, tmp_path / "one.gguf", "--outtype", "f32") == 0
    assert run(three, target_gguf, tmp_path / "three.gguf", "--outtype", "f32") == 0
    a, b = tensors_of(tmp_path / "one.gguf"), tensors_of(tmp_path / "three.gguf")
    assert set(a) == set(b)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    want = {testing.gguf_tensor_name(n): x for n, x in testing.iter_checkpoint_tensors(three)}
    for n in want:
        np.testing.assert_array_equal(b[n], want[n], err_msg=n)


def test_optional_keys(tmp_path: Path, target_gguf: Path) -> None:
    spec = testing.DrafterSpec(
        extra_config={"output_multiplier": 0.5, "final_logit_softcapping": 30.0, "input_embedding_scale": 8.0}
    )
    ckpt = testing.make_drafter_checkpoint(tmp_path / "ck", target_gguf, spec)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(is_causal=True, use_sliding_window=True, sliding_window=256,
               layer_types=["sliding_attention", "full_attention"])
    (ckpt / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "o.gguf"
    assert run(ckpt, target_gguf, out) == 0
    k = keys_of(out)
    assert k["dflash.logit_scale"] == pytest.approx(0.5)
    assert k["dflash.final_logit_softcapping"] == pytest.approx(30.0)
    assert k["dflash.embedding_scale"] == pytest.approx(8.0)
    assert k["dflash.attention.causal"] is True
    assert k["dflash.attention.sliding_window"] == 256
    assert k["dflash.attention.sliding_window_pattern"] == [True, False]
    hp = pydflash2.inspect_drafter(str(out))
    assert hp["causal"] and hp["sliding_window"] == 256


def _hf_target_dir(target_gguf: Path, d: Path) -> Path:
    """A Hugging Face style directory for the fixture target (tokenizer.json + config)."""
    k = keys_of(target_gguf)
    tokens = k["tokenizer.ggml.tokens"]
    n_special = len(testing.SPECIAL_TOKENS)
    vocab = {t: i for i, t in enumerate(tokens) if i >= n_special}
    d.mkdir()
    tok = {
        "model": {"type": "BPE", "vocab": vocab, "merges": k["tokenizer.ggml.merges"]},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(testing.SPECIAL_TOKENS)],
    }
    # BpeVocab wants the base vocabulary to start at 0: renumber specials after it
    base = {t: i for i, t in enumerate(tokens[n_special:])}
    tok["model"]["vocab"] = base
    tok["added_tokens"] = [
        {"id": len(base) + i, "content": t, "special": True} for i, t in enumerate(testing.SPECIAL_TOKENS)
    ]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": testing.CHATML_TEMPLATE}))
    (d / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
                    "vocab_size": len(tokens)})
    )
    return d


def test_hf_target_directory(tmp_path: Path, drafter2_ckpt: Path, target_gguf: Path) -> None:
    hf = _hf_target_dir(target_gguf, tmp_path / "target-hf")
    out = tmp_path / "o.gguf"
    assert run(drafter2_ckpt, hf, out) == 0
    k = keys_of(out)
    assert k["tokenizer.ggml.model"] == "gpt2"
    assert len(k["tokenizer.ggml.tokens"]) == len(keys_of(target_gguf)["tokenizer.ggml.tokens"])
    assert k["tokenizer.chat_template"] == testing.CHATML_TEMPLATE
    assert k["tokenizer.ggml.merges"] == keys_of(target_gguf)["tokenizer.ggml.merges"]
    pydflash2.inspect_drafter(str(out))


# ---------------------------------------------------------------- validation


def _variant(src: Path, dst: Path, *, config=None, tensors=None) -> Path:
    """A copy of checkpoint src with config edits and/or tensor edits (name -> array or None)."""
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        t = dict(testing.iter_checkpoint_tensors(src))
        for name, arr in tensors.items():
            if arr is None:
                t.pop(name)
            else:
                t[name] = arr
        (dst / "model.safetensors").unlink()
        save_file(t, str(dst / "model.safetensors"))
    return dst


def _dc(**kv):
    def edit(cfg: dict) -> None:
        cfg["dflash_config"].update(kv)
    return edit


def _drop_dc(key: str):
    def edit(cfg: dict) -> None:
        cfg["dflash_config"].pop(key)
    return edit


def _set(**kv):
    def edit(cfg: dict) -> None:
        cfg.update(kv)
    return edit


CASES = {
    "hidden": (dict(config=_set(hidden_size=32, head_dim=8)), "hidden size mismatch"),
    "vocab": (dict(config=_set(vocab_size=500)), "vocab size mismatch"),
    "layer_id": (dict(config=_dc(target_layer_ids=[0, 1, 4])), "target layer id 4 is out of range"),
    "mask": (dict(config=_dc(mask_token_id=100000)), "mask_token_id 100000 is outside the vocabulary"),
    "v2_keys": (dict(config=_drop_dc("selector_rank")), "missing selector_rank"),
    "lattice": (dict(config=_dc(selector_top_k=8)), "too small for selector_top_k 8"),
    "shape": (
        dict(tensors={"layers.1.mlp.up_proj.weight": np.zeros((96, 64), np.float32)}),
        "'layers.1.mlp.up_proj.weight' has shape [96, 64], expected [128, 64]",
    ),
    "unknown": (dict(tensors={"mystery.weight": np.zeros((4,), np.float32)}), "unknown tensor 'mystery.weight'"),
    "missing": (dict(tensors={"norm.weight": None}), "missing tensor 'norm.weight'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validation_fails_cleanly(case: str, tmp_path: Path, drafter2_ckpt: Path, target_gguf: Path, capsys) -> None:
    edits, message = CASES[case]
    ckpt = _variant(drafter2_ckpt, tmp_path / "ck", **edits)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc = run(ckpt, target_gguf, out_dir / "d.gguf")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err
    assert list(out_dir.iterdir()) == []  # no output, no temp file


def test_mask_embedding_needs_torch(tmp_path: Path, drafter2_ckpt: Path, target_gguf: Path, capsys) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed")
    ckpt = _variant(drafter2_ckpt, tmp_path / "ck")
    (ckpt / "mask_embedding.pt").write_bytes(b"PK")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert run(ckpt, target_gguf, out_dir / "d.gguf") == 2
    assert "torch is not installed" in capsys.readouterr().err
    assert list(out_dir.iterdir()) == []


def test_existing_output_needs_force(tmp_path: Path, drafter1_ckpt: Path, target_gguf: Path) -> None:
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep")
    assert run(drafter1_ckpt, target_gguf, out) == 2
    assert out.read_bytes() == b"keep"
    assert run(drafter1_ckpt, target_gguf, out, "--force") == 0
    assert pydflash2.inspect_drafter(str(out))["version"] == 1


# ---------------------------------------------------------------- entry points


def test_help(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        convert_main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for word in ("--target", "--outtype", "q8_0", "mask_embedding.pt", "exit codes", "target_layer_ids"):
        assert word in text


def test_python_dash_m_and_pydflash2_cli(tmp_path: Path, drafter2_ckpt: Path, target_gguf: Path) -> None:
    out = tmp_path / "m.gguf"
    r = subprocess.run(
        [sys.executable, "-m", "pydflash2.convert", str(drafter2_ckpt), "--target", str(target_gguf),
         "-o", str(out), "--outtype", "q8_0"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert pydflash2.inspect_drafter(str(out))["version"] == 2

    from pydflash2.cli import main as cli_main

    out2 = tmp_path / "c.gguf"
    assert cli_main(["convert", str(drafter2_ckpt), "--target", str(target_gguf), "-o", str(out2),
                     "--no-progress"]) == 0
    assert out2.exists()
