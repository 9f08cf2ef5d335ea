"""Every check that runs before a byte is written. Each returns one message per problem."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydflash2.capture import capture_rule

from .checkpoint import V2_KEYS, Checkpoint
from .mapping import IGNORED, expected_shapes, gguf_name, normalize, optional_shapes
from .target import Target

_REQUIRED_CONFIG = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
)


def validate(ckpt: Checkpoint, target: Target) -> list[str]:
    """All problems that stop a conversion (empty list: good to go)."""
    problems = _config_problems(ckpt)
    if problems:  # shapes cannot be derived from a broken config
        return problems
    problems += _target_problems(ckpt, target)
    problems += _tensor_problems(ckpt, target)
    return problems


def warnings(ckpt: Checkpoint, target: Target) -> list[str]:
    """Things that convert fine but may not run everywhere."""
    return fit_warnings(ckpt.dflash("target_layer_ids") or [], target)


def fit_warnings(target_layer_ids: list[int], target: Target) -> list[str]:
    """Drafter/target pairs that work here but not in every runtime (layer ids as in
    Hugging Face configs: dflash.target_layers minus one)."""
    out = []
    last = [i for i in target_layer_ids if i == target.n_layer - 1]
    if not last:
        return out
    rule = capture_rule(target.arch, target.n_layer) if target.arch else None
    if rule is not None and rule.max_layer >= target.n_layer:
        return out  # this target's capture path gives the last layer's output
    where = f"a {target.arch} target" if target.arch else "this target"
    out.append(
        f"target layer id {last[0]} is the target's last layer: it becomes dflash.target_layers "
        f"{last[0] + 1} (= n_layer), which {where} cannot give through llama.cpp's layer-input taps "
        "(upstream llama.cpp aborts on it; pydflash2 reads it only on targets without taps, through its "
        "capture callback)"
    )
    return out


def _config_problems(ckpt: Checkpoint) -> list[str]:
    cfg = ckpt.config
    out = [f"config.json: missing {k!r}" for k in _REQUIRED_CONFIG if k not in cfg]
    for k in ("block_size", "mask_token_id", "target_layer_ids"):
        if ckpt.dflash(k) is None:
            out.append(f"config.json: dflash_config is missing {k!r}")
    tl = ckpt.dflash("target_layer_ids")
    if tl is not None and (not isinstance(tl, list) or not tl or not all(isinstance(i, int) for i in tl)):
        out.append(f"config.json: target_layer_ids must be a non-empty list of integers, got {tl!r}")
    dc = cfg.get("dflash_config") or {}
    present = [k for k in V2_KEYS if k in dc]
    if ckpt.declares_v2 and len(present) != len(V2_KEYS):
        missing = [k for k in V2_KEYS if k not in dc]
        out.append(
            "config.json: DFlash2 needs all of the v2 keys together "
            f"({', '.join(V2_KEYS)}); missing {', '.join(missing)}"
        )
    if out:
        return out
    H = ckpt.hidden_size
    if H % ckpt.n_head:
        if "head_dim" not in cfg:
            out.append(f"config.json: hidden_size {H} not divisible by num_attention_heads {ckpt.n_head}")
    if ckpt.version == 2:
        k, g = int(dc["selector_top_k"]), int(dc["conv_group_size"])
        if H < k * (k + 1):
            out.append(
                f"hidden size {H} is too small for selector_top_k {k}: "
                f"upstream packs the lattice into H-wide rows and needs H >= top_k*(top_k+1) = {k * (k + 1)}"
            )
        if g <= 0 or H % g:
            out.append(f"hidden size {H} is not divisible by conv_group_size {g}")
        for key in ("conv_kernel_size", "selector_rank", "selector_top_k"):
            if int(dc[key]) <= 0:
                out.append(f"config.json: {key} must be positive, got {dc[key]}")
    return out


def _target_problems(ckpt: Checkpoint, target: Target) -> list[str]:
    has_d2t = any(normalize(n) == "d2t" for n in ckpt.tensors)
    return fit_problems(
        target, hidden_size=ckpt.hidden_size, vocab_size=int(ckpt.config["vocab_size"]),
        target_layer_ids=ckpt.dflash("target_layer_ids"), mask_token_id=ckpt.dflash("mask_token_id"),
        reduced_vocab=has_d2t,
    )


def fit_problems(
    target: Target, *, hidden_size: int, vocab_size: int, target_layer_ids: list[int], mask_token_id: object,
    reduced_vocab: bool = False,
) -> list[str]:
    """Whether a drafter fits a target, from the drafter's numbers alone: shared by the
    converter (Hugging Face config) and `pydflash2 modelfile` (drafter GGUF). Layer ids
    are Hugging Face's (dflash.target_layers minus one); reduced_vocab: the drafter maps a
    smaller draft vocabulary through d2t, so its vocab_size need not be the target's."""
    out = []
    if hidden_size != target.n_embd:
        out.append(f"hidden size mismatch: drafter hidden_size {hidden_size} != target's {target.n_embd}")
    if vocab_size != target.n_vocab and not reduced_vocab:
        out.append(f"vocab size mismatch: drafter vocab_size {vocab_size} != target's {target.n_vocab}")
    for i in target_layer_ids:
        if not 0 <= i < target.n_layer:
            out.append(
                f"target layer id {i} is out of range: the target has {target.n_layer} layers "
                f"(0..{target.n_layer - 1})"
            )
    if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < target.n_vocab:
        out.append(f"mask_token_id {mask_token_id} is outside the vocabulary (0..{target.n_vocab - 1})")
    return out


def gguf_fit(hp: Mapping[str, Any], target: Target) -> tuple[list[str], list[str]]:
    """fit_problems and fit_warnings of a drafter GGUF, from its numbers as
    pydflash2.info.inspect_drafter gives them (its dflash.target_layers name the next
    layer's input: Hugging Face's ids plus one)."""
    layer_ids = [i - 1 for i in hp["target_layers"]]
    problems = fit_problems(target, hidden_size=hp["n_embd"], vocab_size=hp["n_vocab"], target_layer_ids=layer_ids,
                            mask_token_id=hp["mask_token_id"])
    return problems, fit_warnings(layer_ids, target)


def _tensor_problems(ckpt: Checkpoint, target: Target) -> list[str]:
    n_layer = int(ckpt.config["num_hidden_layers"])
    required = expected_shapes(ckpt, target.n_embd, target.n_vocab)
    d2t = next((ref for n, ref in ckpt.tensors.items() if normalize(n) == "d2t"), None)
    n_vocab_draft = int(ckpt.config.get("draft_vocab_size") or (d2t.shape[0] if d2t else target.n_vocab))
    optional = optional_shapes(ckpt, target.n_vocab, n_vocab_draft)
    out = []
    seen = set()
    for name, ref in ckpt.tensors.items():
        key = normalize(name)
        if key in IGNORED:
            continue
        if gguf_name(name, n_layer, ckpt.version) is None:
            kind = "DFlash2" if ckpt.version == 2 else "DFlash"
            out.append(f"unknown tensor {name!r} {list(ref.shape)}: not part of the {kind} layout")
            continue
        seen.add(key)
        want = required.get(key) or optional.get(key)
        if want is not None and tuple(ref.shape) != want:
            out.append(f"tensor {name!r} has shape {list(ref.shape)}, expected {list(want)} from the config")
        if key != "d2t" and ref.dtype not in ("BF16", "F16", "F32"):
            out.append(f"tensor {name!r} has unsupported dtype {ref.dtype} (expected BF16, F16 or F32)")
    out += [f"missing tensor {k!r} (expected shape {list(s)})" for k, s in required.items() if k not in seen]
    if n_vocab_draft < target.n_vocab and d2t is None:
        out.append(f"draft_vocab_size {n_vocab_draft} < vocab size {target.n_vocab} but no d2t tensor")
    if d2t is not None and "lm_head.weight" not in seen:
        out.append("a reduced-vocab drafter (d2t) must ship its own lm_head.weight")
    return out
