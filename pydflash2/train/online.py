"""Online distillation (`pydflash2 train --online`): the target writes sequences while
the drafter trains on them, and nothing goes to disk.

A producer thread runs the very Distiller that offline mode runs (llama.cpp, on any
device with -ngl) over the prompts, epoch after epoch; finished sequences go into
a bounded queue instead of a DatasetWriter (`SequenceQueue` is the Distiller's
sink, as the writer is offline), so memory is bounded by the queue and data by
time, not disk. The trainer takes `batch` sequences per step (each sequence is
trained on once) and samples anchors from them with the same `sample_batch` as
offline mode: the same prompts give the same batches either way.

A per-position field of a sequence (the target's soft labels: topk_ids, topk_logp
with --soft-top-k) is a keyword of `SequenceQueue.add`, kept in `StreamSequence.fields`,
and handed out by `SequenceWindow.soft_labels` as `Dataset.soft_labels` hands it out offline.

llama.cpp releases the GIL while it decodes, so the target and the trainer run at
the same time (on a CPU they share its cores).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .dataset import TOKEN_DTYPE, feature_rows
from .distill import Distiller
from .objective import Batch, sample_batch


class _Stopped(Exception):
    """The trainer is done: the producer leaves the Distiller's loop."""


@dataclass
class StreamSequence:
    prompt: int
    tokens: np.ndarray  # [L] int32
    features: np.ndarray  # [L, width] float16, as the dataset stores them
    prompt_len: int
    fields: dict[str, np.ndarray] = field(default_factory=dict)  # further per-position data


class SequenceQueue:
    """The Distiller's sink in online mode: finished sequences into a bounded queue.
    add() waits while the queue is full, so the trainer sets the pace."""

    def __init__(self, maxsize: int, stop: threading.Event) -> None:
        self.queue: queue.Queue[StreamSequence] = queue.Queue(maxsize)
        self.stop = stop

    @property
    def done_prompts(self) -> set[int]:
        return set()  # a stream keeps nothing: every epoch distils every prompt

    def add(self, prompt: int, tokens: np.ndarray, features: np.ndarray, prompt_len: int,
            **per_position: np.ndarray) -> None:
        seq = StreamSequence(prompt, np.asarray(tokens, dtype=TOKEN_DTYPE), feature_rows(features), prompt_len,
                             dict(per_position))
        while True:
            if self.stop.is_set():
                raise _Stopped
            try:
                self.queue.put(seq, timeout=0.2)
                return
            except queue.Full:
                continue


class SequenceWindow:
    """Sequences of the stream, read like a Dataset: ids are stream positions."""

    def __init__(self, first_id: int, seqs: list[StreamSequence], width: int, top_k: int = 0) -> None:
        self.ids = np.arange(first_id, first_id + len(seqs))
        self.seqs = {int(i): s for i, s in zip(self.ids, seqs, strict=True)}
        self.width, self.top_k = width, top_k

    def __len__(self) -> int:
        return len(self.seqs)

    def sequence(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        s = self.seqs[int(i)]
        return s.tokens, s.features, s.prompt_len

    def soft_labels(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(topk_ids, topk_logp) [L, top_k] of sequence i, as Dataset.soft_labels."""
        f = self.seqs[int(i)].fields
        return f["topk_ids"], f["topk_logp"]

    def completion_tokens(self) -> int:
        return sum(len(s.tokens) - s.prompt_len for s in self.seqs.values())

    def token_counts(self, n_vocab: int) -> np.ndarray:
        counts = np.zeros(n_vocab, dtype=np.int64)
        for s in self.seqs.values():
            counts += np.bincount(s.tokens[s.prompt_len :], minlength=n_vocab)[:n_vocab]
        return counts


class OnlineStream:
    """The target distilling `prompts` (from `start` on, round and round) in a thread."""

    def __init__(self, target: str | Path, prompts: list[str], target_layer_ids: list[int], n_embd: int, *,
                 n_seq: int = 8, max_new: int = 128, n_threads: int | None = None, n_gpu_layers: int = 0,
                 queue_size: int = 64, start: int = 0, top_k: int = 0) -> None:
        if not prompts:
            raise ValueError("online distillation needs at least one prompt")
        self.width = len(target_layer_ids) * n_embd
        self.top_k = top_k  # > 0: sequences carry the target's top-k (soft labels), as distill stores them
        self.taken = 0  # sequences handed to the trainer so far: the next one's stream id
        self.completion_tokens = 0
        self._stop = threading.Event()
        self._sink = SequenceQueue(queue_size, self._stop)
        self._error: BaseException | None = None
        self._pending: list[StreamSequence] = []  # given back: handed out again before new ones
        start %= len(prompts)
        order = prompts[start:] + prompts[:start]

        def produce() -> None:
            try:
                with Distiller(target, target_layer_ids, n_seq=n_seq, max_len=512 + max_new, n_threads=n_threads,
                               n_gpu_layers=n_gpu_layers, top_k=top_k) as d:
                    while not self._stop.is_set():
                        d.run(order, self._sink, max_new=max_new, progress=False)
            except _Stopped:
                pass
            except BaseException as e:  # handed to the trainer's next take()
                self._error = e

        self._thread = threading.Thread(target=produce, name="pydflash2-online-distill", daemon=True)
        self._thread.start()

    def take(self, n: int) -> SequenceWindow:
        """The next n sequences (waits for the target to write them)."""
        seqs = self._pending[:n]
        del self._pending[:n]
        while len(seqs) < n:
            try:
                seqs.append(self._sink.queue.get(timeout=0.5))
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError(f"online distillation failed: {self._error}") from self._error
                if not self._thread.is_alive():
                    raise RuntimeError("online distillation stopped") from None
        window = SequenceWindow(self.taken, seqs, self.width, self.top_k)
        self.taken += n
        self.completion_tokens += window.completion_tokens()
        return window

    def give_back(self, window: SequenceWindow, first_unused: int) -> None:
        """The latest window's sequences from stream id `first_unused` on were not used: the
        next take() hands them out again, with the same ids, before any new one."""
        if len(window) and int(window.ids[-1]) + 1 != self.taken:
            raise ValueError("only the latest window can be given back")
        back = [window.seqs[int(i)] for i in window.ids if i >= first_unused]
        self._pending = back + self._pending
        self.taken -= len(back)
        self.completion_tokens -= sum(len(s.tokens) - s.prompt_len for s in back)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> OnlineStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def online_batches(stream: OnlineStream, batch_seqs: int, anchors: int, block: int,
                   anchor_seed: Callable[[int], int]) -> Callable[[int], Batch]:
    """step -> a batch of the next `batch_seqs` sequences of the stream."""

    def batch(step: int) -> Batch:
        w = stream.take(batch_seqs)
        return sample_batch(w, None, len(w), anchors, block, seq_ids=w.ids, anchor_seed=anchor_seed(step))

    return batch
