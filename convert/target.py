"""The target model as the converter needs it: shape, tokenizer metadata, and
(only for mask_embedding.pt drafters) its token embeddings and output head.

A target is either a GGUF file (tokenizer keys copied verbatim, chat template
included) or a Hugging Face model directory (tokenizer read through
gguf.vocab; no transformers needed for BPE tokenizer.json / SentencePiece).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

log = logging.getLogger(__name__)


class TargetError(Exception):
    """The target cannot be read."""


@dataclass
class Target:
    """Shape of the target plus access to its tokenizer and output tensors."""

    path: Path
    kind: str  # "gguf" or "hf"
    n_embd: int
    n_layer: int
    n_vocab: int
    arch: str = ""  # llama.cpp architecture name ("" when unknown)
    _reader: gguf.GGUFReader | None = None
    _config: dict[str, Any] | None = None

    # ---------------------------------------------------------------- tokenizer

    def write_tokenizer(self, writer: gguf.GGUFWriter) -> None:
        """Writes the target's tokenizer metadata (and chat template) into writer."""
        if self.kind == "gguf":
            self._copy_gguf_tokenizer(writer)
        else:
            self._write_hf_tokenizer(writer)

    def _copy_gguf_tokenizer(self, writer: gguf.GGUFWriter) -> None:
        assert self._reader is not None
        for key, f in self._reader.fields.items():
            if not key.startswith("tokenizer.") or key == gguf.Keys.Tokenizer.MASK_ID:
                continue
            vtype = gguf.GGUFValueType(f.types[0])
            sub = gguf.GGUFValueType(f.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, f.contents(), vtype, sub)

    def _write_hf_tokenizer(self, writer: gguf.GGUFWriter) -> None:
        vocab = _hf_vocab(self.path)
        tokens: list[bytes] = []
        scores: list[float] = []
        types: list[int] = []
        for text, score, ttype in vocab.all_tokens():
            tokens.append(text)
            scores.append(score)
            types.append(int(ttype))
        for i in range(len(tokens), self.n_vocab):  # config vocab padded beyond the tokenizer
            tokens.append(f"[PAD{i}]".encode())
            scores.append(-1000.0)
            types.append(int(gguf.TokenType.UNUSED))
        writer.add_tokenizer_model(vocab.tokenizer_model)
        if vocab.tokenizer_model == "gpt2":
            # the pre-tokenizer hash table lives in upstream's convert script; "default" is
            # llama.cpp's generic GPT-2 style split
            writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        if vocab.tokenizer_model != "gpt2":
            writer.add_token_scores(scores)
        writer.add_token_types(types)
        special = gguf.SpecialVocab(self.path, load_merges=vocab.tokenizer_model == "gpt2", n_vocab=len(tokens))
        special.add_to_gguf(writer, quiet=True)

    # ---------------------------------------------------------------- tensors

    def output_tensors(self) -> tuple[np.ndarray, np.ndarray]:
        """(token embeddings [V, H], output head [V, H]) as float32 (head = embeddings if tied)."""
        if self.kind == "gguf":
            assert self._reader is not None
            by_name = {t.name: t for t in self._reader.tensors}
            if "token_embd.weight" not in by_name:
                raise TargetError(f"{self.path.name} has no token_embd.weight")
            emb = _dequant(by_name["token_embd.weight"])
            head = _dequant(by_name["output.weight"]) if "output.weight" in by_name else emb
            return emb, head
        from safetensors import safe_open

        def find(name: str) -> np.ndarray:
            for part in sorted(self.path.glob("*.safetensors")):
                with safe_open(str(part), framework="np") as f:
                    for cand in (name, "model." + name, "model.language_model." + name):
                        if cand in f.keys():
                            return np.asarray(f.get_tensor(cand), dtype=np.float32)
            raise TargetError(f"target tensor {name!r} not found in {self.path}")

        emb = find("embed_tokens.weight")
        cfg = self._config or {}
        tied = cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False))
        return emb, (emb if tied else find("lm_head.weight"))


# Hugging Face model_type -> llama.cpp architecture, where the names differ
# (upstream's convert_hf_to_gguf.py makes these choices)
_HF_TO_LLAMA_CPP_ARCH = {
    "mistral": "llama",
    "gemma3_text": "gemma3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
    "gpt_oss": "gpt-oss",
}


def _llama_cpp_arch(model_type: str) -> str:
    return _HF_TO_LLAMA_CPP_ARCH.get(model_type, model_type)


def _dequant(t: Any) -> np.ndarray:
    from gguf.quants import dequantize

    arr = dequantize(t.data, gguf.GGMLQuantizationType(t.tensor_type))
    shape = tuple(int(d) for d in reversed(t.shape))
    return np.asarray(arr, dtype=np.float32).reshape(shape)


def _hf_vocab(path: Path) -> Any:
    from gguf.vocab import BpeVocab, SentencePieceVocab

    errors = []
    for cls in (BpeVocab, SentencePieceVocab):
        try:
            return cls(path)
        except (FileNotFoundError, ImportError, ValueError) as e:
            errors.append(f"{cls.__name__}: {e}")
    try:
        from gguf.vocab import LlamaHfVocab

        return LlamaHfVocab(path)
    except Exception as e:  # needs transformers
        errors.append(f"LlamaHfVocab: {e}")
    raise TargetError(f"cannot read the tokenizer in {path} ({'; '.join(errors)})")


def open_target(path: str | Path) -> Target:
    """Opens a target GGUF file or Hugging Face model directory."""
    path = Path(path)
    if path.is_file():
        try:
            r = gguf.GGUFReader(str(path))
        except Exception as e:
            raise TargetError(f"{path} is not a readable GGUF file ({e})") from e
        arch_f = r.get_field("general.architecture")
        if arch_f is None:
            raise TargetError(f"{path} has no general.architecture")
        arch = arch_f.contents()

        def num(key: str) -> int | None:
            f = r.get_field(key)
            return None if f is None else int(f.contents())

        n_embd, n_layer = num(f"{arch}.embedding_length"), num(f"{arch}.block_count")
        tok = r.get_field("tokenizer.ggml.tokens")
        if n_embd is None or n_layer is None:
            raise TargetError(f"{path} lacks {arch}.embedding_length / {arch}.block_count")
        if tok is None:
            raise TargetError(f"{path} has no tokenizer (tokenizer.ggml.tokens)")
        return Target(path, "gguf", n_embd, n_layer, len(tok.data), arch=str(arch), _reader=r)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise TargetError(f"{path} has no config.json")
        cfg = json.loads(cfg_file.read_text())
        text = {**cfg, **cfg.get("text_config", {})}
        try:
            return Target(
                path, "hf", int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"]),
                arch=_llama_cpp_arch(str(text.get("model_type", ""))), _config=cfg,
            )
        except KeyError as e:
            raise TargetError(f"{cfg_file} lacks {e.args[0]!r}") from e
    raise TargetError(f"{path} is neither a GGUF file nor a model directory")
