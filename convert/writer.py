"""Writing the dflash GGUF: metadata keys, then tensor data streamed block by block.

All tensor infos are declared first (GGUFWriter.add_tensor_info); data is then
read, converted and written a block of rows at a time, so peak memory stays
near one block, not one model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import quant_shape_to_byte_shape, quantize
from tqdm import tqdm

from .checkpoint import Checkpoint
from .mapping import IGNORED, gguf_name, normalize
from .target import Target

log = logging.getLogger(__name__)

ARCH = "dflash"
QT = gguf.GGMLQuantizationType
OUTTYPES: dict[str, QT] = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}
_FILE_TYPE = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
BLOCK_BYTES = 32 * 1024 * 1024  # rows read per step, in stored bytes


@dataclass
class TensorPlan:
    """One output tensor: its GGUF name, numpy shape, output type and a block source."""

    name: str
    shape: tuple[int, ...]
    qtype: QT
    blocks: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        if self.qtype == QT.I64:
            return int(np.prod(self.shape)) * 8
        return int(np.prod(quant_shape_to_byte_shape(self.shape, self.qtype)))


# ---------------------------------------------------------------- metadata


def metadata(ckpt: Checkpoint) -> list[tuple[str, object, gguf.GGUFValueType]]:
    """(key, value, type) for every dflash.* key, following upstream conversion/qwen.py."""
    cfg, U32, F32, BOOL, ARR = (
        ckpt.config,
        gguf.GGUFValueType.UINT32,
        gguf.GGUFValueType.FLOAT32,
        gguf.GGUFValueType.BOOL,
        gguf.GGUFValueType.ARRAY,
    )
    a = ARCH
    n_layer = int(cfg["num_hidden_layers"])
    keys: list[tuple[str, object, gguf.GGUFValueType]] = [
        (f"{a}.block_count", n_layer, U32),
        (f"{a}.context_length", int(cfg.get("max_position_embeddings", 4096)), U32),
        (f"{a}.embedding_length", ckpt.hidden_size, U32),
        (f"{a}.feed_forward_length", int(cfg["intermediate_size"]), U32),
        (f"{a}.attention.head_count", ckpt.n_head, U32),
        (f"{a}.attention.head_count_kv", int(cfg["num_key_value_heads"]), U32),
        (f"{a}.attention.key_length", ckpt.head_dim, U32),
        (f"{a}.attention.value_length", ckpt.head_dim, U32),
        (f"{a}.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]), F32),
        (f"{a}.rope.freq_base", ckpt.rope_theta, F32),
        (f"{a}.vocab_size", int(cfg["vocab_size"]), U32),
        (f"{a}.block_size", int(ckpt.dflash("block_size", 16)), U32),
        # HF id i = output of decoder layer i = INPUT of layer i+1, which is what the runtime taps
        (f"{a}.target_layers", [int(i) + 1 for i in ckpt.dflash("target_layer_ids")], ARR),
    ]
    if ckpt.version == 2:
        for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            keys.append((f"{a}.{k}", int(ckpt.dflash(k)), U32))
    rope = cfg.get("rope_parameters") or {}
    if (prf := rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))) is not None:
        keys.append((f"{a}.rope.dimension_count", int(ckpt.head_dim * float(prf)), U32))
    if (vs := ckpt.dflash("attention_value_scale")) is not None:
        keys.append((f"{a}.attention.value_scale", float(vs), F32))
    if (act := cfg.get("hidden_act")) not in (None, "silu"):
        keys.append((f"{a}.hidden_activation", str(act), gguf.GGUFValueType.STRING))
    if (om := ckpt.dflash("output_multiplier")) is not None:
        keys.append((f"{a}.logit_scale", float(om), F32))
    if (sc := ckpt.dflash("final_logit_softcapping")) is not None and float(sc) > 0:
        keys.append((f"{a}.final_logit_softcapping", float(sc), F32))
    if (es := ckpt.dflash("input_embedding_scale")) is not None:
        keys.append((f"{a}.embedding_scale", float(es), F32))
    dc = cfg.get("dflash_config") or {}
    use_swa = bool(cfg.get("use_sliding_window", False) or dc.get("use_swa", False))
    window = dc.get("swa_window_size") or cfg.get("sliding_window")
    if use_swa and window:
        if dc.get("use_swa", False):
            pattern = [True] * n_layer
        else:
            pattern = [lt == "sliding_attention" for lt in cfg.get("layer_types") or []]
        keys.append((f"{a}.attention.sliding_window", int(window), U32))
        if pattern:
            keys.append((f"{a}.attention.sliding_window_pattern", pattern, ARR))
    causal = cfg.get("is_causal")
    if causal is None:
        causal = dc.get("causal")
    if causal is not None:
        keys.append((f"{a}.attention.causal", bool(causal), BOOL))
    return keys


# ---------------------------------------------------------------- tensor plan


def _out_type(name: str, shape: tuple[int, ...], outtype: str) -> QT:
    if len(shape) <= 1 or name.endswith("_conv_base"):
        return QT.F32  # norms and conv base kernels are elementwise: keep f32
    qt = OUTTYPES[outtype]
    if qt == QT.Q8_0 and shape[-1] % gguf.GGML_QUANT_SIZES[QT.Q8_0][0] != 0:
        log.info("%s: row length %d is not a multiple of 32, writing f16 instead of q8_0", name, shape[-1])
        return QT.F16
    return qt


def plan_tensors(
    ckpt: Checkpoint,
    target: Target,
    outtype: str,
    mask_embedding: tuple[int, np.ndarray] | None = None,
) -> list[TensorPlan]:
    """The output tensors in checkpoint order (plus the mask-embedding pair, if any)."""
    n_layer = int(ckpt.config["num_hidden_layers"])
    plans: list[TensorPlan] = []
    for hf, ref in ckpt.tensors.items():
        if normalize(hf) in IGNORED:
            continue
        name = gguf_name(hf, n_layer, ckpt.version)
        assert name is not None, hf  # validate() rejected unknown tensors
        if name == "d2t":
            plans.append(TensorPlan(name, ref.shape, QT.I64, lambda hf=hf: iter([_d2t_absolute(ckpt, hf)])))
            continue
        if mask_embedding is not None and name in ("token_embd.weight", "output.weight"):
            continue  # replaced below from the target, as upstream does
        qt = _out_type(name, ref.shape, outtype)
        plans.append(TensorPlan(name, ref.shape, qt, lambda hf=hf: ckpt.iter_row_blocks(hf, BLOCK_BYTES)))
    if mask_embedding is not None:
        mask_id, vec = mask_embedding
        emb, head = target.output_tensors()
        emb = emb.copy()
        # the target's mask row is untrained; the drafter brings its own vector
        emb[mask_id] = vec
        for name, arr in (("token_embd.weight", emb), ("output.weight", head)):
            plans.append(TensorPlan(name, arr.shape, _out_type(name, arr.shape, outtype), lambda arr=arr: iter([arr])))
    return plans


def _d2t_absolute(ckpt: Checkpoint, hf: str) -> np.ndarray:
    """d2t as absolute target token ids (checkpoints store offsets), like upstream."""
    d = ckpt.read(hf).astype(np.int64).reshape(-1)
    return d + np.arange(d.size, dtype=np.int64)


def _encode(block: np.ndarray, qt: QT) -> np.ndarray:
    if qt == QT.I64:
        return np.ascontiguousarray(block, dtype=np.int64)
    return np.ascontiguousarray(quantize(np.asarray(block, dtype=np.float32), qt))


# ---------------------------------------------------------------- writing


def write_gguf(
    path: Path,
    ckpt: Checkpoint,
    target: Target,
    plans: list[TensorPlan],
    outtype: str,
    *,
    progress: bool | None = None,
) -> None:
    """Writes the whole file at path (the caller handles temp file and rename)."""
    w = gguf.GGUFWriter(str(path), arch=ARCH)
    w.add_name(str(ckpt.config.get("_name_or_path") or ckpt.path.name))
    w.add_file_type(int(_FILE_TYPE[outtype]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype in metadata(ckpt):
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)  # type: ignore[arg-type]
        else:
            w.add_key_value(key, value, vtype)
    target.write_tokenizer(w)
    w.add_mask_token_id(int(ckpt.dflash("mask_token_id")))

    for p in plans:
        if p.qtype in (QT.F32, QT.F16, QT.I64):
            np_dtype = {QT.F32: np.float32, QT.F16: np.float16, QT.I64: np.int64}[p.qtype]
            w.add_tensor_info(p.name, p.shape, np.dtype(np_dtype), p.nbytes)
        else:
            byte_shape = quant_shape_to_byte_shape(p.shape, p.qtype)
            w.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), p.nbytes, raw_dtype=p.qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None and len(w.fout) == 1
    fout = w.fout[0]
    total = sum(p.nbytes for p in plans)
    disable = None if progress is None else not progress  # None: only on a terminal
    with tqdm(total=total, unit="B", unit_scale=True, desc="writing tensors", disable=disable) as bar:
        for p in plans:
            w.write_padding(fout, fout.tell())
            written = 0
            for block in p.blocks():
                data = _encode(block, p.qtype)
                data.tofile(fout)
                written += data.nbytes
                bar.update(data.nbytes)
                del data, block
            if written != p.nbytes:
                raise RuntimeError(f"{p.name}: wrote {written} bytes, expected {p.nbytes}")
            w.write_padding(fout, written)
    w.close()
