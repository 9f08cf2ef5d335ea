"""Random drafters for any target: the right shape for it, random weights.

Their drafts are noise. They let a user try the draft-verify loop on a new
target, measure its costs and check losslessness before a trained drafter
exists (`pydflash2 random-drafter`), and they are what the tests and
benchmarks run on. A random drafter is written in the published Hugging Face
layout (config.json + safetensors) and turned into a GGUF by our converter,
like any real checkpoint.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from .train.target import pick_mask_token


@dataclass(frozen=True)
class DrafterSpec:
    """Shape of a drafter checkpoint (the defaults fit the tiny test target of pydflash2.testing)."""

    version: int = 2
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    block_size: int = 8
    # Hugging Face numbering: id i taps the output of layer i, i.e. the input of
    # layer i+1, and llama.cpp captures inputs of layers 0..n_layer-1 only, so
    # ids run 0..n_layer-2 (the tiny target has 4 layers)
    target_layer_ids: tuple[int, ...] = (0, 1, 2)
    mask_token_id: int = 3  # the tiny target's <|mask|>
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 8
    selector_top_k: int = 4
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    extra_config: dict = field(default_factory=dict)  # merged into dflash_config
    seed: int = 1


def read_target_shape(target_gguf: str | Path) -> dict[str, int]:
    """Hidden size, layer count and vocabulary size of a target GGUF."""
    r = gguf.GGUFReader(str(target_gguf))
    arch = r.get_field("general.architecture").contents()
    return {
        "n_embd": int(r.get_field(f"{arch}.embedding_length").contents()),
        "n_layer": int(r.get_field(f"{arch}.block_count").contents()),
        "n_vocab": len(r.get_field("tokenizer.ggml.tokens").data),
    }


_DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


def drafter_tensors(spec: DrafterSpec, n_embd: int, n_vocab: int) -> dict[str, np.ndarray]:
    """Random float32 weights under the published Hugging Face names."""
    rng = np.random.default_rng(spec.seed)
    H, F, V = n_embd, spec.n_ff, n_vocab
    D = H // spec.n_head
    n_tl = len(spec.target_layer_ids)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "fc.weight": mat(H, n_tl * H),
        "hidden_norm.weight": norm(H),
        "norm.weight": norm(H),
    }
    for il in range(spec.n_layer):
        p = f"layers.{il}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = mat(spec.n_head * D, H)
        t[p + "self_attn.k_proj.weight"] = mat(spec.n_head_kv * D, H)
        t[p + "self_attn.v_proj.weight"] = mat(spec.n_head_kv * D, H)
        t[p + "self_attn.o_proj.weight"] = mat(H, spec.n_head * D)
        t[p + "self_attn.q_norm.weight"] = norm(D)
        t[p + "self_attn.k_norm.weight"] = norm(D)
        t[p + "mlp.gate_proj.weight"] = mat(F, H)
        t[p + "mlp.up_proj.weight"] = mat(F, H)
        t[p + "mlp.down_proj.weight"] = mat(H, F)
        if spec.version == 2:
            K, G = spec.conv_kernel_size, H // spec.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                # identity kernel (tap 0 = 1) plus noise, so the math is exercised
                base = 0.2 * rng.standard_normal((2, K, H))
                base[:, 0, :] += 1.0
                t[f"{p}{conv}.base_kernel"] = base.astype(np.float32)
                t[f"{p}{conv}.kernel_projection.weight"] = 0.2 * mat(2 * K * G, H)
    if spec.version == 2:
        R = spec.selector_rank
        t["candidate_selector.hidden_projection.weight"] = mat(R, H)
        t["candidate_selector.predecessor_codebook"] = rng.standard_normal((V, R)).astype(np.float32)
        t["candidate_selector.successor_codebook"] = rng.standard_normal((V, R)).astype(np.float32)
    return t


def drafter_config(spec: DrafterSpec, n_embd: int, n_vocab: int) -> dict:
    dflash_config: dict = {
        "block_size": spec.block_size,
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": list(spec.target_layer_ids),
    }
    if spec.version == 2:
        dflash_config.update(
            conv_kernel_size=spec.conv_kernel_size,
            conv_group_size=spec.conv_group_size,
            selector_rank=spec.selector_rank,
            selector_top_k=spec.selector_top_k,
        )
    dflash_config.update(spec.extra_config)
    return {
        "architectures": ["DFlash2DraftModel" if spec.version == 2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": n_embd,
        "num_hidden_layers": spec.n_layer,
        "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv,
        "head_dim": n_embd // spec.n_head,
        "intermediate_size": spec.n_ff,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        "vocab_size": n_vocab,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dflash_config": dflash_config,
    }


def make_drafter_checkpoint(
    out_dir: str | Path,
    target_gguf: str | Path,
    spec: DrafterSpec = DrafterSpec(),
    *,
    dtype: str = "bf16",
    shards: int = 1,
) -> Path:
    """Writes a random drafter for target_gguf in the Hugging Face layout
    (config.json + model.safetensors, or shards + model.safetensors.index.json)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = read_target_shape(target_gguf)
    cfg = drafter_config(spec, shape["n_embd"], shape["n_vocab"])
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = {k: v.astype(_DTYPES[dtype]) for k, v in drafter_tensors(spec, shape["n_embd"], shape["n_vocab"]).items()}
    if shards <= 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        part = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n] for n in names[i::shards]}
        save_file(chunk, str(out / part), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, part))
    total = sum(t.nbytes for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return out


def spec_for_target(target_gguf: str | Path, *, version: int = 2, n_layer: int = 2, block_size: int = 16,
                    top_k: int = 16, rank: int = 32) -> DrafterSpec:
    """A drafter shape that fits any llama-family target (DFlash2 needs H >= top_k*(top_k+1))."""
    shape = read_target_shape(target_gguf)
    H, L = shape["n_embd"], shape["n_layer"]
    n_head = max(1, H // 64)
    while top_k > 1 and top_k * (top_k + 1) > H:
        top_k -= 1
    return DrafterSpec(
        mask_token_id=pick_mask_token(gguf.GGUFReader(str(target_gguf))),
        version=version,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head // 3 if n_head % 3 == 0 else n_head,
        n_ff=4 * H,
        block_size=block_size,
        # five taps spread over the capturable layer inputs (HF ids 0..L-2)
        target_layer_ids=tuple(sorted({round(i * (L - 2) / 4) for i in range(5)})),
        conv_group_size=64 if H % 64 == 0 else H,
        selector_rank=rank,
        selector_top_k=top_k,
    )


def random_drafter_gguf(target_gguf: str | Path, out_gguf: str | Path, spec: DrafterSpec | None = None,
                        outtype: str = "f16") -> Path:
    """A random drafter GGUF for any target, through pydflash2.convert (all of its checks)."""
    from .convert.cli import main as convert_main

    spec = spec or spec_for_target(target_gguf)
    name = f"random-dflash{'2' if spec.version == 2 else ''}-drafter"  # the converter names the GGUF after the folder
    with tempfile.TemporaryDirectory() as d:
        ckpt = make_drafter_checkpoint(Path(d) / name, target_gguf, spec, dtype="f32")
        rc = convert_main([str(ckpt), "--target", str(target_gguf), "-o", str(out_gguf), "--outtype", outtype,
                           "--force", "--no-progress"])
    if rc != 0:
        raise RuntimeError(f"pydflash2 convert failed with exit code {rc}")
    return Path(out_gguf)
