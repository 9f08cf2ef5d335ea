"""Self-distillation through llama.cpp: chat-templated prompts in, the target's
own greedy continuations out, with the target's layer-input features captured
from the very same decodes.

Several sequences share every decode (continuous batching over `n_seq` slots of
one llama.cpp context): a slot that finishes is written out and refilled with
the next prompt's prefill in the next batch, so each decode stays wide enough
to keep the cores busy. The KV cache is unified across sequences so llama.cpp
keeps the batch in order and layer-input row r belongs to batch token r.

Features come through the capture path the target's architecture needs
(pydflash2.capture, one rule table with the engine): llama.cpp's layer-input
taps where they exist, else the graph evaluation callback, installed in the
context and armed around each decode. Both give the same rows (bit for bit on
a llama target), so the dataset is the same whichever path made it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from .. import capture as feature_capture
from ..llama_ext import LlamaError, ext, silence_logs
from .dataset import DatasetWriter
from .prompts import as_messages


class SequenceSink(Protocol):
    """Where finished sequences go: a DatasetWriter (offline) or the online queue (online.py)."""

    @property
    def done_prompts(self) -> set[int]: ...

    def add(self, prompt: int, tokens: np.ndarray, features: np.ndarray, prompt_len: int,
            **per_position: np.ndarray) -> None: ...


def default_threads(offloaded: bool) -> int:
    """llama-cpp-python's default, half the logical CPUs, while layers run on the CPU; with
    every layer offloaded the CPU only schedules, so a few threads do."""
    half = max(1, (os.cpu_count() or 2) // 2)
    return min(half, 4) if offloaded else half


def target_fingerprint(path: str | Path) -> str:
    """A cheap identity of a GGUF file: size and the hash of its first and last MiB."""
    p = Path(path)
    h = hashlib.sha256(str(p.stat().st_size).encode())
    with open(p, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, p.stat().st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def chat_tokens(llm, prompt: str) -> list[int]:  # noqa: ANN001  (a llama_cpp.Llama)
    """The prompt as `Speculator.tokenize_prompt(prompt, chat=True)` makes it; a prompt line that
    holds a JSON conversation (multi-turn, see prompts.as_messages) goes through the template whole."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        return llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)

    def text(tok: int) -> str:
        return "" if tok < 0 else llm._model.token_get_text(tok)

    fmt = Jinja2ChatFormatter(template=template, eos_token=text(llm.token_eos()), bos_token=text(llm.token_bos()))
    result = fmt(messages=as_messages(prompt))
    return llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)


def top_k_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [k] best first, log-probabilities [k] under the full softmax) of one logit row."""
    logits = np.asarray(logits, dtype=np.float32)
    ids = np.argpartition(-logits, k - 1)[:k]
    ids = ids[np.lexsort((ids, -logits[ids]))]  # by logit, ties by id (argmax's pick first)
    m = float(logits.max())
    lse = m + float(np.log(np.exp(logits - m, dtype=np.float64).sum()))
    return ids.astype(np.int32), (logits[ids] - lse).astype(np.float32)


@dataclass
class _Slot:
    prompt: int = -1
    tokens: list[int] = field(default_factory=list)
    feats: list[np.ndarray] = field(default_factory=list)
    soft: list[tuple[np.ndarray, np.ndarray] | None] = field(default_factory=list)  # per fed row, when top_k
    prompt_len: int = 0
    fed: int = 0  # tokens already run through the target


class Distiller:
    """One llama.cpp context on the target with layer-input capture (taps or callback)."""

    def __init__(self, target: str | Path, target_layer_ids: list[int], *, n_seq: int = 8, max_len: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, top_k: int = 0) -> None:
        import llama_cpp
        from llama_cpp import llama_cpp as lc

        silence_logs()
        self.lc = lc
        self.llm = llama_cpp.Llama(str(target), vocab_only=True, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.layer_ids = list(target_layer_ids)
        self.n_seq, self.max_len = n_seq, max_len
        self.top_k = top_k  # > 0: keep the target's top-k log-probabilities of every output row
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        self.model = lc.llama_model_load_from_file(str(target).encode(), mp)
        if not self.model:
            raise LlamaError(f"cannot load target {target}")
        n_layer = int(lc.llama_model_n_layer(self.model))
        self.arch = feature_capture.model_arch(self.model)
        rule = feature_capture.capture_rule(self.arch, n_layer)
        usable = rule.layers()  # layer INPUTS; HF id i is the input of layer i+1
        bad = [i for i in self.layer_ids if i + 1 not in usable]
        if bad:
            lc.llama_model_free(self.model)
            raise ValueError(f"target layer ids {bad} cannot be tapped: this {self.arch} target has {n_layer} layers, "
                             f"usable ids are {usable.start - 1}..{usable.stop - 2} (id i taps the input of layer "
                             f"i+1; {rule.path} capture)")
        self.path = rule.path
        # the callback sees the last layer's output only for rows that output logits
        self.all_rows = self.path == "callback" and any(i + 1 == n_layer for i in self.layer_ids)
        self.capture: feature_capture.CallbackCapture | None = None
        self.n_embd = int(lc.llama_model_n_embd(self.model))
        self.vocab = lc.llama_model_get_vocab(self.model)
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_seq * max_len
        cp.n_batch = cp.n_ubatch = max(512, n_seq * 4)
        cp.n_seq_max = n_seq
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = n_threads or default_threads(n_gpu_layers > n_layer)
        self.n_batch = int(cp.n_batch)
        if self.path == "callback":
            self.capture = feature_capture.CallbackCapture()
            self.capture.install(cp)
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise LlamaError("cannot create the target context")
        if self.path == "tap":
            for i in self.layer_ids:
                ext.set_embeddings_layer_inp(self.ctx, i + 1, True)
        self.batch = lc.llama_batch_ext_init(self.ctx)

    def close(self) -> None:
        lc = self.lc
        if getattr(self, "batch", None):
            lc.llama_batch_ext_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            lc.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> Distiller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ decoding

    def _features(self, n: int) -> np.ndarray:
        H = self.n_embd
        out = np.empty((n, len(self.layer_ids) * H), dtype=np.float32)
        for k, lid in enumerate(self.layer_ids):
            if self.capture is not None:
                out[:, k * H : (k + 1) * H] = self.capture.rows(lid + 1)
                continue
            ptr = ext.get_embeddings_layer_inp(self.ctx, lid + 1)
            if not ptr:
                raise LlamaError(f"target layer input {lid + 1} was not extracted")
            out[:, k * H : (k + 1) * H] = np.ctypeslib.as_array(ptr, shape=(n, H))
        return out

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> tuple[np.ndarray, dict[int, int], dict]:
        """items: (seq, token, pos, wants_logits). Returns (features [n, width], {item index: argmax},
        {item index: (top-k ids, log-probabilities)} when top_k)."""
        lc = self.lc
        lc.llama_batch_ext_clear(self.batch)
        for seq, tok, pos, out in items:
            idx = lc.llama_batch_ext_add_token(self.batch, seq, int(tok))
            if idx < 0:
                raise LlamaError(f"llama_batch_ext_add_token failed ({idx})")
            lc.llama_batch_ext_set_pos(self.batch, idx, (lc.llama_pos * 4)(pos, 0, 0, 0))
            lc.llama_batch_ext_set_output_logits(self.batch, idx, out or self.all_rows)
        if self.capture is not None:  # one ubatch (n_batch = n_ubatch), rows in batch order
            self.capture.arm([i + 1 for i in self.layer_ids], self.n_embd, len(items))
        try:
            rc = lc.llama_process(self.ctx, lc.LLAMA_PROCESS_TYPE_DECODE, self.batch)
        finally:
            if self.capture is not None:
                self.capture.disarm()
        if rc != 0:
            raise LlamaError(f"llama_process returned {rc}")
        if self.capture is not None:
            try:
                self.capture.check(self.arch)
            except feature_capture.CaptureError as e:
                raise LlamaError(str(e)) from None
        feats = self._features(len(items))
        greedy, soft = {}, {}
        for i, (_, _, _, out) in enumerate(items):
            if out:
                logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
                greedy[i] = int(np.argmax(logits))
                if self.top_k:
                    soft[i] = top_k_logprobs(logits, self.top_k)
        return feats, greedy, soft

    def run(self, prompts: list[str], writer: SequenceSink, *, max_new: int = 128, progress: bool | None = None,
            deadline: float | None = None) -> int:
        """Generates every prompt not in the dataset yet; returns the number written."""
        import time

        lc = self.lc
        todo = [i for i in range(len(prompts)) if i not in writer.done_prompts]
        queue = list(reversed(todo))
        slots = [_Slot() for _ in range(self.n_seq)]
        mem = lc.llama_get_memory(self.ctx)
        written = 0
        bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="distilling", unit="prompt",
                   disable=None if progress is None else not progress)
        def finish(s: int, slot: _Slot) -> None:
            rows = np.zeros((len(slot.tokens), len(self.layer_ids) * self.n_embd), dtype=np.float32)
            rows[: slot.fed] = np.stack(slot.feats)
            soft = {}
            if self.top_k:  # rows that output no logits (prompt rows, the last token): id -1
                ids = np.full((len(slot.tokens), self.top_k), -1, dtype=np.int32)
                logp = np.zeros((len(slot.tokens), self.top_k), dtype=np.float32)
                for j, row in enumerate(slot.soft):
                    if row is not None:
                        ids[j], logp[j] = row
                soft = {"topk_ids": ids, "topk_logp": logp}
            writer.add(slot.prompt, np.array(slot.tokens), rows, slot.prompt_len, **soft)
            bar.update(1)
            lc.llama_memory_seq_rm(mem, s, 0, -1)
            slots[s] = _Slot()

        try:
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    # out of time: a cut continuation is still the target's own greedy text
                    for s, slot in enumerate(slots):
                        if slot.prompt >= 0 and slot.fed == len(slot.tokens) - 1 and slot.fed > slot.prompt_len:
                            finish(s, slot)
                            written += 1
                    break
                items: list[tuple[int, int, int, bool]] = []
                owners: list[int] = []
                for s, slot in enumerate(slots):
                    if slot.prompt < 0 and queue:
                        i = queue.pop()
                        toks = chat_tokens(self.llm, prompts[i])[: self.max_len - max_new]
                        # room for this prefill plus one decode token of every slot
                        if len(items) + len(toks) + self.n_seq > self.n_batch and items:
                            queue.append(i)  # prefill next step; the batch is full
                            continue
                        slots[s] = slot = _Slot(prompt=i, tokens=list(toks), prompt_len=len(toks))
                    if slot.prompt < 0:
                        continue
                    for j in range(slot.fed, len(slot.tokens)):
                        items.append((s, slot.tokens[j], j, j == len(slot.tokens) - 1))
                        owners.append(s)
                if not items:
                    break
                feats, greedy, soft = self._decode(items)
                for i, s in enumerate(owners):
                    slots[s].feats.append(feats[i])
                    slots[s].soft.append(soft.get(i))
                    slots[s].fed += 1
                    if i in greedy:
                        slots[s].tokens.append(greedy[i])
                for s, slot in enumerate(slots):
                    if slot.prompt < 0 or slot.fed == 0 or slot.fed != len(slot.tokens) - 1:
                        continue
                    last = slot.tokens[-1]
                    n_new = len(slot.tokens) - slot.prompt_len
                    if lc.llama_vocab_is_eog(self.vocab, last) or n_new >= max_new:
                        finish(s, slot)
                        written += 1
        finally:
            bar.close()
        return written


def distill(target: str | Path, prompts: list[str], out: str | Path, target_layer_ids: list[int], *,
            n_seq: int = 8, max_new: int = 128, n_threads: int | None = None, progress: bool | None = None,
            deadline: float | None = None, n_gpu_layers: int = 0, top_k: int = 0) -> Path:
    """Fills (or resumes) the dataset at `out` from `prompts`; top_k > 0 also keeps the target's
    top-k next-token log-probabilities of every generated position (soft labels)."""
    import gguf

    r = gguf.GGUFReader(str(target))
    arch = r.get_field("general.architecture").contents()
    meta = {
        "target": str(Path(target).resolve()),
        "target_sha": target_fingerprint(target),
        "target_layer_ids": list(target_layer_ids),
        "n_taps": len(target_layer_ids),
        "n_embd": int(r.get_field(f"{arch}.embedding_length").contents()),
        "n_vocab": len(r.get_field("tokenizer.ggml.tokens").data),
        "max_new": max_new,
        "feature_dtype": "float16",
        "top_k": top_k,
    }
    del r
    with DatasetWriter(out, meta) as writer, Distiller(target, target_layer_ids, n_seq=n_seq,
                                                       max_len=512 + max_new, n_threads=n_threads,
                                                       n_gpu_layers=n_gpu_layers, top_k=top_k) as d:
        d.run(prompts, writer, max_new=max_new, progress=progress, deadline=deadline)
    return Path(out)


