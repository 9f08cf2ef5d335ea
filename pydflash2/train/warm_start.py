"""A trained `dflash` GGUF back into the PyTorch drafter, to train it further (`pydflash2 train
--init-drafter F.gguf`): adapt a drafter to your prompts instead of starting from random layers.

The GGUF fixes the drafter's shape, the target layers it reads and its draft vocabulary (d2t);
the run takes them all from it. Weights are dequantised with `gguf` (a q8_0 file starts within
its rounding of the original). The head rows are not read: the trainer's head is the target's,
frozen, and the GGUF's `output.weight` is those rows quantised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..convert.mapping import hf_names
from .model import DFlash2Drafter, DrafterConfig

# tensors of the GGUF that are not drafter parameters in training
_NOT_TRAINED = {"output.weight", "token_embd.weight", "d2t"}


def _reader(path: str | Path):  # noqa: ANN202
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001  (gguf raises ValueError, struct and numpy errors on bad files)
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None


def _field(reader, key: str, *, required: bool = True):  # noqa: ANN001, ANN202
    f = reader.get_field(key)
    if f is None and required:
        raise ValueError(f"the drafter GGUF lacks {key}")
    return None if f is None else f.contents()


def drafter_config(path: str | Path, *, n_embd: int, n_vocab: int, mask_token_id: int) -> DrafterConfig:
    """The config a dflash GGUF implies, checked against the target it will train beside.
    mask_token_id: the target's MASK, used where the file does not name its own."""
    r = _reader(path)
    arch = _field(r, "general.architecture", required=False)
    if arch != "dflash":
        raise ValueError(f"{path} is not a dflash drafter GGUF (architecture {arch!r})")
    a = "dflash"
    H = int(_field(r, f"{a}.embedding_length"))
    if H != n_embd:
        raise ValueError(f"{path} was made for a target of hidden size {H}; this target's is {n_embd}")
    vocab = int(_field(r, f"{a}.vocab_size"))
    if vocab != n_vocab:
        raise ValueError(f"{path} was made for a vocabulary of {vocab} tokens; this target has {n_vocab}")
    names = {t.name: t for t in r.tensors}
    version = 2 if "selector_hidden.weight" in names else 1
    d2t = names.get("d2t")
    draft_ids = [] if d2t is None else [int(x) for x in np.asarray(d2t.data, dtype=np.int64).reshape(-1)]
    if draft_ids and (min(draft_ids) < 0 or max(draft_ids) >= n_vocab):
        raise ValueError(f"{path}: its d2t holds ids outside the target's vocabulary")
    n_head = int(_field(r, f"{a}.attention.head_count"))
    own_mask = _field(r, "tokenizer.ggml.mask_token_id", required=False)
    cfg = DrafterConfig(
        n_embd=H, n_vocab=vocab,
        target_layer_ids=[int(i) - 1 for i in _field(r, f"{a}.target_layers")],  # GGUF: layer inputs (HF id + 1)
        mask_token_id=mask_token_id if own_mask is None else int(own_mask),
        n_layer=int(_field(r, f"{a}.block_count")), n_head=n_head,
        n_head_kv=int(_field(r, f"{a}.attention.head_count_kv")),
        head_dim=int(_field(r, f"{a}.attention.key_length", required=False) or H // n_head),
        n_ff=int(_field(r, f"{a}.feed_forward_length")), block_size=int(_field(r, f"{a}.block_size")),
        rms_eps=float(_field(r, f"{a}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(r, f"{a}.rope.freq_base", required=False) or 10000.0), version=version,
        draft_ids=draft_ids,
    )
    if version == 2:
        cfg.conv_kernel_size = int(_field(r, f"{a}.conv_kernel_size"))
        cfg.conv_group_size = int(_field(r, f"{a}.conv_group_size"))
        cfg.selector_rank = int(_field(r, f"{a}.selector_rank"))
        cfg.selector_top_k = int(_field(r, f"{a}.selector_top_k"))
    return cfg


def read_weights(path: str | Path, cfg: DrafterConfig) -> dict[str, np.ndarray]:
    """HF name -> the GGUF's tensor (dequantised, float32) for every trained parameter of the
    drafter `cfg` describes; each must be in the file, with its shape."""
    from gguf.quants import dequantize

    with torch.device("meta"):  # the parameter shapes, without memory
        table = torch.empty(cfg.n_vocab, cfg.n_embd)
        shapes = {k: tuple(v.shape) for k, v in DFlash2Drafter(cfg, table, table).state_dict().items()}
    to_hf = hf_names(cfg.n_layer, cfg.version)
    out: dict[str, np.ndarray] = {}
    for t in _reader(path).tensors:
        if t.name in _NOT_TRAINED:
            continue
        hf = to_hf.get(t.name)
        if hf not in shapes:
            raise ValueError(f"{path}: tensor {t.name} has no place in this drafter")
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        if tuple(w.shape) != shapes[hf]:
            raise ValueError(f"{path}: {t.name} is {list(w.shape)}, the drafter's {hf} {list(shapes[hf])}")
        out[hf] = w
    missing = sorted(set(shapes) - set(out))
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return out


def load_weights(model: DFlash2Drafter, path: str | Path) -> None:
    """The model's parameters become the GGUF's."""
    own = model.state_dict()
    with torch.no_grad():
        for hf, w in read_weights(path, model.config).items():
            own[hf].copy_(torch.from_numpy(w))
