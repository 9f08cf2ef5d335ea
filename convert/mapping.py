"""Hugging Face tensor names -> upstream `dflash` GGUF names, and the shapes the config implies."""

from __future__ import annotations

import re

from .checkpoint import Checkpoint

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_V2 = {
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
_GLOBAL = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
}
_GLOBAL_V2 = {
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
    # the codebooks have no `.weight` in the checkpoint; upstream's loader wants it
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
}
# optional tensors some drafters ship
_OPTIONAL = {
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "d2t": "d2t",
}
# present in some checkpoints, never used at run time (upstream drops it too)
IGNORED = {"t2d"}

_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)")


def normalize(hf_name: str) -> str:
    """Drops the `model.` prefix some exports add."""
    return hf_name[len("model.") :] if hf_name.startswith("model.") else hf_name


def gguf_name(hf_name: str, n_layer: int, version: int) -> str | None:
    """The GGUF name of a checkpoint tensor, or None if it is unknown."""
    name = normalize(hf_name)
    m = _LAYER_RE.fullmatch(name)
    if m:
        il, rest = int(m.group(1)), m.group(2)
        if il >= n_layer:
            return None
        table = {**_LAYER, **_LAYER_V2} if version == 2 else _LAYER
        return f"blk.{il}.{table[rest]}" if rest in table else None
    table = {**_GLOBAL, **_OPTIONAL, **(_GLOBAL_V2 if version == 2 else {})}
    return table.get(name)


def hf_names(n_layer: int, version: int) -> dict[str, str]:
    """GGUF name -> Hugging Face name of every tensor a drafter of this shape has (the inverse
    of gguf_name, optional tensors included)."""
    out = {g: h for h, g in {**_GLOBAL, **_OPTIONAL, **(_GLOBAL_V2 if version == 2 else {})}.items()}
    table = {**_LAYER, **_LAYER_V2} if version == 2 else _LAYER
    for il in range(n_layer):
        out.update({f"blk.{il}.{g}": f"layers.{il}.{h}" for h, g in table.items()})
    return out


def expected_shapes(ckpt: Checkpoint, target_hidden: int, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Normalized HF name -> numpy shape for every required tensor the config implies."""
    cfg = ckpt.config
    H, D = ckpt.hidden_size, ckpt.head_dim
    n_head, n_kv = ckpt.n_head, int(cfg["num_key_value_heads"])
    F, n_layer = int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    n_tl = len(ckpt.dflash("target_layer_ids") or [])
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, n_tl * target_hidden),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
    }
    for il in range(n_layer):
        p = f"layers.{il}."
        out.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (n_head * D, H),
                p + "self_attn.k_proj.weight": (n_kv * D, H),
                p + "self_attn.v_proj.weight": (n_kv * D, H),
                p + "self_attn.o_proj.weight": (H, n_head * D),
                p + "self_attn.q_norm.weight": (D,),
                p + "self_attn.k_norm.weight": (D,),
                p + "mlp.gate_proj.weight": (F, H),
                p + "mlp.up_proj.weight": (F, H),
                p + "mlp.down_proj.weight": (H, F),
            }
        )
    if ckpt.version == 2:
        K = int(ckpt.dflash("conv_kernel_size"))
        G = H // int(ckpt.dflash("conv_group_size"))
        R = int(ckpt.dflash("selector_rank"))
        for il in range(n_layer):
            for conv in ("attention_conv", "mlp_conv"):
                out[f"layers.{il}.{conv}.base_kernel"] = (2, K, H)
                out[f"layers.{il}.{conv}.kernel_projection.weight"] = (2 * K * G, H)
        out["candidate_selector.hidden_projection.weight"] = (R, H)
        out["candidate_selector.predecessor_codebook"] = (n_vocab, R)
        out["candidate_selector.successor_codebook"] = (n_vocab, R)
    return out


def optional_shapes(ckpt: Checkpoint, n_vocab: int, n_vocab_draft: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the optional tensors (token embeddings, own head, d2t)."""
    H = ckpt.hidden_size
    return {
        "embed_tokens.weight": (n_vocab, H),
        "lm_head.weight": (n_vocab_draft, H),
        "d2t": (n_vocab_draft,),
    }
