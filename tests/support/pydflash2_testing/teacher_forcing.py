"""Teacher-forced batch invariance: plain batch-1 greedy decoding against the same tokens decoded
as row 0 of [token, junk...] batches, with llama-cpp-python alone (no pydflash2 code in the loop).

Speculative verification decodes [anchor, drafts...] as one batch and keeps the rows it accepts, so
its logits and the K/V rows it leaves are batch-B numerics; plain decoding's are batch-1 numerics.
`batched` keeps row 0's K/V (the junk is cut off with llama_memory_seq_rm) and every position is
compared at the same prefix, so up to the first argmax flip it IS free-running batched greedy
decoding. Used by tests/test_exact.py and benchmarks/batch_invariance.py.
"""

from __future__ import annotations

import llama_cpp
import numpy as np


class RawDecoder:
    """llama_decode on sequence 0 of a Llama's context, logits of chosen rows."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.ctx = llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = llm.n_vocab()
        self.batch = llama_cpp.llama_batch_init(llm.n_batch, 0, 1)

    def decode(self, tokens: list[int], pos0: int, rows: list[int]) -> list[np.ndarray]:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i in rows
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc})")
        return [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, r), shape=(self.n_vocab,)).copy()
                for r in rows]

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    def truncate(self, pos: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1)

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)


def reference(dec: RawDecoder, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """Plain batch-1 greedy decoding: tokens and the logits that chose each."""
    dec.clear()
    logits = dec.decode(prompt, 0, [len(prompt) - 1])[0]
    tokens, rows = [], []
    for i in range(n):
        tok = int(np.argmax(logits))
        tokens.append(tok)
        rows.append(logits)
        if i + 1 < n:
            logits = dec.decode([tok], len(prompt) + i, [0])[0]
    return tokens, rows


def batched(dec: RawDecoder, prompt: list[int], ref: list[int], batch: int,
            rng: np.random.Generator) -> list[np.ndarray]:
    """The reference tokens decoded as [token, junk...] batches of `batch` rows, row 0 kept."""
    dec.clear()
    rows = [dec.decode(prompt, 0, [len(prompt) - 1])[0]]
    for i, tok in enumerate(ref[:-1]):
        pos = len(prompt) + i
        junk = rng.integers(0, dec.n_vocab, size=batch - 1).tolist()
        rows.append(dec.decode([tok, *junk], pos, [0])[0])
        dec.truncate(pos + 1)
    return rows
