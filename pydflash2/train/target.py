"""What a drafter takes from its target GGUF: shape, frozen tables, MASK, taps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

# names an unused special token tends to have, best first
_MASK_HINTS = ("mask", "pad", "unused", "reserved", "empty", "fim_pad", "repo", "file", "gh_", "issue", "jupyter")


@dataclass
class TargetInfo:
    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rope_theta: float
    rms_eps: float
    mask_token_id: int
    mask_token: str
    eos_token_id: int


def _field(r: gguf.GGUFReader, key: str, default=None):  # noqa: ANN001, ANN202
    f = r.get_field(key)
    return default if f is None else f.contents()


def read_target(path: str | Path) -> TargetInfo:
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    tokens = _field(r, "tokenizer.ggml.tokens")
    mask = pick_mask_token(r)
    n_embd = int(_field(r, f"{arch}.embedding_length"))
    n_head = _per_layer(_field(r, f"{arch}.attention.head_count", 1))
    return TargetInfo(
        path=Path(path),
        arch=arch,
        n_embd=n_embd,
        n_layer=int(_field(r, f"{arch}.block_count")),
        n_vocab=len(tokens),
        n_head=n_head,
        n_head_kv=_per_layer(_field(r, f"{arch}.attention.head_count_kv", n_head)),
        head_dim=int(_field(r, f"{arch}.attention.key_length", n_embd // n_head)),
        n_ff=_per_layer(_field(r, f"{arch}.feed_forward_length", 0)),
        rope_theta=float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        mask_token_id=mask,
        mask_token=tokens[mask],
        eos_token_id=int(_field(r, "tokenizer.ggml.eos_token_id", 0)),
    )


def _per_layer(v) -> int:  # noqa: ANN001
    """A shape key that some architectures store per layer: its most common value."""
    if isinstance(v, list):
        vals = [int(x) for x in v if int(x) > 0]
        return max(set(vals), key=vals.count) if vals else 0
    return int(v)


def pick_mask_token(r: gguf.GGUFReader) -> int:
    """An unused special token: a control/user-defined token that is neither BOS, EOS,
    EOT, padding in use, nor mentioned by the chat template; preferring names that say
    mask / pad / unused. MASK must never occur in real text, so a normal token will not do."""
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type") or []
    template = _field(r, "tokenizer.chat_template", "") or ""
    used = {int(_field(r, f"tokenizer.ggml.{k}_token_id", -1)) for k in ("bos", "eos", "eot", "eom")}
    special = {int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED), int(gguf.TokenType.UNUSED)}
    cands = [i for i, t in enumerate(types) if int(t) in special and i not in used and tokens[i] not in template]
    if not cands:
        raise ValueError("the target has no unused special token to serve as MASK")
    for hint in _MASK_HINTS:
        for i in cands:
            if hint in tokens[i].lower():
                return i
    return cands[-1]


def tap_layers(n_layer: int, n_taps: int) -> list[int]:
    """HF target layer ids spread over the depth, as DFlash's build_target_layer_ids does
    (from layer 1 to n_layer-3). llama.cpp taps layer INPUTS 0..n_layer-1, so id i
    (the output of layer i = the input of layer i+1) must stay <= n_layer-2."""
    if n_layer < 2:
        raise ValueError("the target needs 2 layers or more to tap a layer input")
    hi = n_layer - 3 if n_layer >= 6 else n_layer - 2
    lo = 1 if n_layer >= 5 else 0
    if n_taps == 1:
        return [min(n_layer // 2, n_layer - 2)]
    return sorted({int(round(lo + i * (hi - lo) / (n_taps - 1))) for i in range(n_taps)})


def frozen_tables(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(token embedding [V, H], output head [V, H]) dequantised to float32; a tied
    head is the embedding itself."""
    r = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in r.tensors}

    def deq(name: str) -> np.ndarray:
        t = by_name[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    emb = deq("token_embd.weight")
    head = deq("output.weight") if "output.weight" in by_name else emb
    return emb, head


def output_norm(path: str | Path) -> np.ndarray | None:
    """The target's final norm weight: the drafter's own final norm starts from it, so its
    logits start at the scale the target's head expects."""
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        if t.name == "output_norm.weight":
            return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
    return None


# Archs whose layers are the drafter's layer (pre-norm attention with GQA, SwiGLU MLP, no biases), and
# whether their GGUF stores Q/K rows permuted for llama.cpp's interleaved ("NORM") rotary embedding:
# the converter permutes them from the Hugging Face (NEOX, rotated halves) order that the drafter uses.
_LAYER_ARCHS = {"llama": True, "qwen3": False}


def target_shape(path: str | Path) -> dict[str, int]:
    """The target's attention and MLP shape: n_head, n_head_kv, head_dim, n_ff."""
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    H = int(_field(r, f"{arch}.embedding_length"))
    n_head = int(_field(r, f"{arch}.attention.head_count"))
    return {"n_head": n_head, "n_head_kv": int(_field(r, f"{arch}.attention.head_count_kv", n_head)),
            "head_dim": int(_field(r, f"{arch}.attention.key_length", H // n_head)),
            "n_ff": int(_field(r, f"{arch}.feed_forward_length"))}


def target_layer_weights(path: str | Path, layer: int) -> dict[str, np.ndarray]:
    """Target layer `layer`'s weights under the drafter layer's (Hugging Face) names, float32,
    Q/K rows in the drafter's rotary order. A llama target has no per-head q/k norms: those
    names are absent (the drafter keeps them at ones, its one departure from the target layer)."""
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    if arch not in _LAYER_ARCHS:
        raise ValueError(f"drafter layers can start from target layers of {sorted(_LAYER_ARCHS)} targets, "
                         f"not {arch!r}")
    n_layer = int(_field(r, f"{arch}.block_count"))
    if not 0 <= layer < n_layer:
        raise ValueError(f"target layer {layer} does not exist: the target has layers 0..{n_layer - 1}")
    shape = target_shape(path)
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    prefix = f"blk.{layer}."
    out: dict[str, np.ndarray] = {}
    for t in r.tensors:
        if not t.name.startswith(prefix):
            continue
        base, _, kind = t.name[len(prefix):].rpartition(".")
        if base not in names or kind != "weight":
            raise ValueError(f"target layer {layer} has {t.name}, which a drafter layer cannot hold")
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        out[f"{names[base]}.weight"] = w.reshape(-1) if base.endswith("norm") else w
    missing = {v + ".weight" for k, v in names.items() if not k.endswith("_norm") or k in ("attn_norm", "ffn_norm")}
    if missing - out.keys():
        raise ValueError(f"target layer {layer} lacks {sorted(missing - out.keys())}")
    if _LAYER_ARCHS[arch]:  # undo the converter's permutation: interleaved pairs -> rotated halves
        D = shape["head_dim"]
        for name, heads in (("self_attn.q_proj.weight", shape["n_head"]), ("self_attn.k_proj.weight",
                                                                           shape["n_head_kv"])):
            w = out[name]
            out[name] = w.reshape(heads, D // 2, 2, w.shape[-1]).swapaxes(1, 2).reshape(w.shape)
    return out
