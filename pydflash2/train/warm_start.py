"""A trained `dflash` GGUF back into the PyTorch drafter, to train it further (`pydflash2 train
--init-drafter F.gguf`): adapt a drafter to your prompts instead of starting from random layers.

The GGUF fixes the drafter's shape, the target layers it reads, its MASK token and its draft
vocabulary (d2t); the run takes them all from it. Weights are dequantised with `gguf` (a q8_0
file reads back exactly). The head rows are not read: the trainer's head is the target's, frozen,
and the GGUF's `output.weight` is those rows quantised.
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


def drafter_config(path: str | Path, *, n_embd: int, n_vocab: int) -> DrafterConfig:
    """The config a dflash GGUF implies, checked against the target it will train beside. The file
    is checked against the dflash contract first (inspect_drafter: metadata only, every tensor's
    presence and shape), as the engine checks what it loads."""
    from ..info import DrafterFileError, inspect_drafter

    try:
        h = inspect_drafter(path)
    except DrafterFileError as e:
        raise ValueError(f"{path} is not a dflash drafter GGUF this run can start from: {e}") from None
    if h["n_embd"] != n_embd:
        raise ValueError(f"{path} was made for a target of hidden size {h['n_embd']}; this target's is {n_embd}")
    if h["n_vocab"] != n_vocab:
        raise ValueError(f"{path} was made for a vocabulary of {h['n_vocab']} tokens; this target has {n_vocab}")
    d2t = next((t for t in _reader(path).tensors if t.name == "d2t"), None)
    draft_ids = [] if d2t is None else [int(x) for x in np.asarray(d2t.data, dtype=np.int64).reshape(-1)]
    if draft_ids and (min(draft_ids) < 0 or max(draft_ids) >= n_vocab):
        raise ValueError(f"{path}: its d2t holds ids outside the target's vocabulary")
    cfg = DrafterConfig(
        n_embd=n_embd, n_vocab=n_vocab,
        target_layer_ids=[int(i) - 1 for i in h["target_layers"]],  # GGUF: layer inputs (HF id + 1)
        mask_token_id=h["mask_token_id"], n_layer=h["n_layer"], n_head=h["n_head"], n_head_kv=h["n_head_kv"],
        head_dim=h["head_dim"], n_ff=h["n_ff"], block_size=h["block_size"],
        # float32 in the file; the JSON prints the 9 digits that name it, np.float32 gives it back exactly
        rms_eps=float(np.float32(h["rms_eps"])), rope_theta=float(np.float32(h["rope_freq_base"])),
        version=h["version"], draft_ids=draft_ids,
    )
    if cfg.version == 2:
        cfg.conv_kernel_size, cfg.conv_group_size = h["conv_kernel_size"], h["conv_group_size"]
        cfg.selector_rank, cfg.selector_top_k = h["selector_rank"], h["selector_top_k"]
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
