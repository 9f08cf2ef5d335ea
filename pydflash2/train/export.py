"""A trained drafter out: the Hugging Face DFlash2 checkpoint (published names)
and the dflash GGUF made from it by our converter (pydflash2.convert)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from .model import DFlash2Drafter


def hf_config(model: DFlash2Drafter, n_draft: int) -> dict:
    c = model.config
    dflash_config: dict = {
        "block_size": c.block_size,
        "mask_token_id": c.mask_token_id,
        "target_layer_ids": list(c.target_layer_ids),
    }
    if c.version == 2:
        dflash_config.update(conv_kernel_size=c.conv_kernel_size, conv_group_size=c.conv_group_size,
                             selector_rank=c.selector_rank, selector_top_k=c.selector_top_k)
    cfg = {
        "architectures": ["DFlash2DraftModel" if c.version == 2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": c.n_embd,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "head_dim": c.head_dim,
        "intermediate_size": c.n_ff,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.n_vocab,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "is_causal": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "dflash_config": dflash_config,
    }
    if n_draft < c.n_vocab:
        cfg["draft_vocab_size"] = n_draft
    return cfg


def export_hf(model: DFlash2Drafter, out_dir: str | Path, draft_ids: list[int] | None = None) -> Path:
    """config.json + model.safetensors (float32). draft_ids: a reduced vocabulary for
    this export (rows of the frozen head; default: the one the model trained with);
    [] exports the full vocabulary (no d2t: the runtime uses the target's head)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = list(model.config.draft_ids) if draft_ids is None else list(draft_ids)
    tensors = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    if ids:
        d = np.asarray(ids, dtype=np.int64)
        head = _full_head(model)
        tensors["lm_head.weight"] = np.ascontiguousarray(head[d])
        tensors["d2t"] = d - np.arange(len(d), dtype=np.int64)  # offsets, as EAGLE/DFlash checkpoints store them
    (out / "config.json").write_text(json.dumps(hf_config(model, len(ids) or model.config.n_vocab), indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def _full_head(model: DFlash2Drafter) -> np.ndarray:
    head = getattr(model, "_full_head", None)
    if head is None:
        raise ValueError("the model was built without its full head table; pass head= to build_model")
    return head


def export_gguf(hf_dir: str | Path, target: str | Path, out: str | Path, outtype: str = "q8_0") -> Path:
    """Runs our converter (all of its checks) on the checkpoint."""
    from ..convert.cli import main as convert_main

    rc = convert_main([str(hf_dir), "--target", str(target), "-o", str(out), "--outtype", outtype, "--force",
                       "--no-progress"])
    if rc != 0:
        raise RuntimeError(f"pydflash2 convert failed with exit code {rc}")
    return Path(out)
