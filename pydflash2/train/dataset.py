"""The self-distillation dataset on disk: token ids and target features, memory-mapped.

A dataset directory holds
- meta.json      : target file, tapped layers, feature width, dtype
- tokens.bin     : int32 token ids of every sequence, back to back
- features.bin   : float16 rows [n_rows, n_taps * H], one per token (row r belongs to token r)
- index.jsonl    : one line per finished sequence {"prompt", "start", "length", "prompt_len"}
- topk_ids.bin   : (when meta["top_k"] = k > 0) int32 [n_rows, k]: the target's k most probable
                   next tokens after row r (target ids, best first; -1 where no logits were computed)
- topk_logp.bin  : float16 [n_rows, k]: their log-probabilities under the target's full softmax

Soft labels are kept in target ids, not draft-vocabulary ids: the draft vocabulary is chosen from
the finished data (and may be re-chosen), so the mapping happens when a batch is sampled.

Rows are appended sequence by sequence; a sequence becomes part of the dataset
only when its index line is written (after its data), so an interrupted run
leaves at most a tail that the next open() cuts off: generation resumes from
the prompts whose sequences are not indexed yet.

Feature row j is the target's input of the tapped layers when it processed
token j, i.e. the context the drafter may use once token j is committed. The
last token of a sequence was sampled but never run through the target: its
row is zeros and is never read (no anchor's context reaches it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FEATURE_DTYPE = np.float16
TOKEN_DTYPE = np.int32
TOPK_ID_DTYPE = np.int32
TOPK_LOGP_DTYPE = np.float16


def _files(width: int, top_k: int) -> list[tuple[str, int]]:
    """(file name, bytes per row) of every per-row data file."""
    files = [("tokens.bin", 4), ("features.bin", 2 * width)]
    if top_k:
        files += [("topk_ids.bin", 4 * top_k), ("topk_logp.bin", 2 * top_k)]
    return files


def feature_rows(features: np.ndarray) -> np.ndarray:
    """Features as the dataset keeps them (and online mode hands them over): float16, clipped
    into its range, since some targets' residual streams carry outliers near it."""
    return np.clip(np.asarray(features, dtype=np.float32), -65000.0, 65000.0).astype(FEATURE_DTYPE)


class DatasetError(Exception):
    """The directory is not a dataset this target/tap set can use."""


@dataclass(frozen=True)
class Sequence:
    """One prompt + greedy continuation: rows [start, start+length) of the data files."""

    prompt: int
    start: int
    length: int
    prompt_len: int


class DatasetWriter:
    """Appends finished sequences; safe to interrupt at any point."""

    def __init__(self, path: str | Path, meta: dict) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.width = int(meta["n_taps"]) * int(meta["n_embd"])
        self.top_k = int(meta.get("top_k", 0))
        meta_file = self.path / "meta.json"
        if meta_file.exists():
            old = json.loads(meta_file.read_text())
            old.setdefault("top_k", 0)
            keys = ("target_sha", "target_layer_ids", "n_embd", "n_vocab", "top_k")
            if any(old.get(k) != meta.get(k, 0 if k == "top_k" else None) for k in keys):
                raise DatasetError(
                    f"{self.path} holds data for another target or tap set "
                    f"({ {k: old.get(k) for k in keys} }); use a new --out or delete it"
                )
        else:
            meta_file.write_text(json.dumps(meta, indent=2))
        self.sequences = _read_index(self.path)
        n_rows = self.sequences[-1].start + self.sequences[-1].length if self.sequences else 0
        # cut what an interrupted run wrote past the last indexed sequence
        for name, itemsize in _files(self.width, self.top_k):
            f = self.path / name
            f.touch()
            if f.stat().st_size != n_rows * itemsize:
                os.truncate(f, n_rows * itemsize)
        self.n_rows = n_rows
        self._tokens = open(self.path / "tokens.bin", "ab")  # noqa: SIM115  (kept open while writing)
        self._features = open(self.path / "features.bin", "ab")  # noqa: SIM115
        self._index = open(self.path / "index.jsonl", "a")  # noqa: SIM115
        names = ("topk_ids.bin", "topk_logp.bin") if self.top_k else ()
        self._topk = [open(self.path / n, "ab") for n in names]  # noqa: SIM115

    @property
    def done_prompts(self) -> set[int]:
        return {s.prompt for s in self.sequences}

    def add(self, prompt: int, tokens: np.ndarray, features: np.ndarray, prompt_len: int,
            topk_ids: np.ndarray | None = None, topk_logp: np.ndarray | None = None) -> None:
        """topk_ids/topk_logp [len(tokens), top_k]: required when the dataset keeps soft labels."""
        tokens = np.asarray(tokens, dtype=TOKEN_DTYPE)
        features = feature_rows(features)
        if features.shape != (len(tokens), self.width):
            raise ValueError(f"features must be [{len(tokens)}, {self.width}], got {list(features.shape)}")
        if self.top_k:
            shape = (len(tokens), self.top_k)
            if topk_ids is None or topk_logp is None or np.shape(topk_ids) != shape or np.shape(topk_logp) != shape:
                raise ValueError(f"this dataset keeps the target's top-{self.top_k}: pass topk_ids and topk_logp "
                                 f"of shape {list(shape)}")
            self._topk[0].write(np.ascontiguousarray(topk_ids, dtype=TOPK_ID_DTYPE).tobytes())
            self._topk[1].write(np.ascontiguousarray(topk_logp, dtype=TOPK_LOGP_DTYPE).tobytes())
        self._tokens.write(tokens.tobytes())
        self._features.write(np.ascontiguousarray(features).tobytes())
        for f in (self._tokens, self._features, *self._topk):
            f.flush()
        seq = Sequence(prompt, self.n_rows, len(tokens), prompt_len)
        self._index.write(json.dumps(seq.__dict__) + "\n")
        self._index.flush()
        self.sequences.append(seq)
        self.n_rows += len(tokens)

    def close(self) -> None:
        for f in (self._tokens, self._features, self._index, *self._topk):
            f.close()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_index(path: Path) -> list[Sequence]:
    index = path / "index.jsonl"
    if not index.exists():
        return []
    out = []
    text = index.read_text()
    for line in text.splitlines():
        try:
            out.append(Sequence(**json.loads(line)))
        except (ValueError, TypeError):
            break  # a torn last line from an interrupted run
    # rewrite without the torn tail, so appends start on a clean line; only then: readers on
    # several ranks open the same index at once
    clean = "".join(json.dumps(s.__dict__) + "\n" for s in out)
    if clean != text:
        index.write_text(clean)
    return out


class Dataset:
    """Read side: memory-mapped tokens and features of every indexed sequence."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_file = self.path / "meta.json"
        if not meta_file.exists():
            raise DatasetError(f"{self.path} is not a dataset (no meta.json)")
        self.meta = json.loads(meta_file.read_text())
        self.width = int(self.meta["n_taps"]) * int(self.meta["n_embd"])
        self.top_k = int(self.meta.get("top_k", 0))
        self.sequences = _read_index(self.path)
        n = self.sequences[-1].start + self.sequences[-1].length if self.sequences else 0
        self.n_rows = n
        k = self.top_k
        if n == 0:
            self.tokens = np.zeros(0, dtype=TOKEN_DTYPE)
            self.features = np.zeros((0, self.width), dtype=FEATURE_DTYPE)
            self.topk_ids = np.zeros((0, k), dtype=TOPK_ID_DTYPE)
            self.topk_logp = np.zeros((0, k), dtype=TOPK_LOGP_DTYPE)
        else:
            self.tokens = np.memmap(self.path / "tokens.bin", dtype=TOKEN_DTYPE, mode="r", shape=(n,))
            self.features = np.memmap(self.path / "features.bin", dtype=FEATURE_DTYPE, mode="r", shape=(n, self.width))
            if k:
                self.topk_ids = np.memmap(self.path / "topk_ids.bin", dtype=TOPK_ID_DTYPE, mode="r", shape=(n, k))
                self.topk_logp = np.memmap(self.path / "topk_logp.bin", dtype=TOPK_LOGP_DTYPE, mode="r", shape=(n, k))

    def __len__(self) -> int:
        return len(self.sequences)

    def sequence(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(tokens [L], features [L, width], prompt_len) of sequence i."""
        s = self.sequences[i]
        return self.tokens[s.start : s.start + s.length], self.features[s.start : s.start + s.length], s.prompt_len

    def subset(self, prompts: set[int]) -> Dataset:
        """The same files, seeing only the sequences of these prompt indices (ablations by source)."""
        import copy

        view = copy.copy(self)
        view.sequences = [s for s in self.sequences if s.prompt in prompts]
        return view

    def soft_labels(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(topk_ids [L, k], topk_logp [L, k]) of sequence i: row j is the target's distribution of token j+1."""
        if not self.top_k:
            raise DatasetError(f"{self.path} keeps no soft labels (distilled without --soft-top-k)")
        s = self.sequences[i]
        return self.topk_ids[s.start : s.start + s.length], self.topk_logp[s.start : s.start + s.length]

    def completion_tokens(self) -> int:
        return sum(s.length - s.prompt_len for s in self.sequences)

    def token_counts(self, n_vocab: int) -> np.ndarray:
        """How often each token id appears among the generated (label) tokens."""
        counts = np.zeros(n_vocab, dtype=np.int64)
        for s in self.sequences:
            ids = self.tokens[s.start + s.prompt_len : s.start + s.length]
            counts += np.bincount(ids, minlength=n_vocab)[:n_vocab]
        return counts
