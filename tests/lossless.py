"""Comparing speculative greedy output with plain llama-cpp-python greedy decoding.

On a batch-invariant target (pydflash2.exactness) the two must be identical,
token for token. Elsewhere verification's batched forward rounds differently
from plain decoding's batch-1 forward, so the runs may part at a near-tie of
plain decoding; this helper checks that they part nowhere else, and stops
comparing at that position (the continuations differ legitimately after it).

Delta, derived from measurement, not tuned until tests pass: what decides
whether a batch flips plain decoding's choice is how much it changes plain
decoding's top-2 gap (logit of its top token minus that of its runner-up). On
the stock build (llama-cpp-python 0.3.36, llamafile sgemm), teacher-forced
batch-8 decoding with K/V written by the batches against batch-1 decoding
(benchmarks/batch_invariance.py --batch 8 --threads 1; batches of 2 gave the
same max |logit difference|) changed that gap by at most:

  SmolLM2-135M Q4_1:  0.511 over 256 positions (8 prompts x 32 tokens; max
                      |logit difference| 1.64; flips seen at margins <= 0.107)
  tiny fixture:       0.0112 over 2304 positions (24 prompts x 96 tokens; the
                      hot-token target of test_speculator.py)

A run may part from plain decoding only where plain's gap is below the change a
batch can make; delta = that maximum x 2 (safety factor for positions, prompts
and machines not measured).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp
import numpy as np
from scipy.stats import chi2_contingency

SAFETY = 2.0
DELTA_SMOLLM2 = SAFETY * 0.511
DELTA_TINY = SAFETY * 0.0112


@dataclass
class PlainRun:
    tokens: list[int]
    # plain decoding's top-1 minus top-2 logit where it chose each token (and,
    # when it ended at EOS, one more: where it chose EOS)
    margins: list[float]


def greedy_generate(llm: llama_cpp.Llama, prompt: str, n: int) -> list[int]:
    """Plain llama.cpp greedy decoding of a text prompt through Llama.generate, no pydflash2 code
    (up to n tokens, stopping at EOS)."""
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    out: list[int] = []
    for tok in llm.generate(tokens, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, reset=True):
        if tok == llm.token_eos():
            break
        out.append(tok)
        if len(out) == n:
            break
    return out


def plain_greedy(llm: llama_cpp.Llama, prompt: list[int], n: int) -> PlainRun:
    """Plain batch-1 greedy decoding with llama-cpp-python alone (Llama.eval,
    the loop Llama.generate runs), with the top-2 margin of every choice."""
    llm.reset()
    llm.eval(prompt)
    tokens: list[int] = []
    margins: list[float] = []
    for _ in range(n):
        # the last eval's logits row (Llama keeps llm.scores only with logits_all)
        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(row, shape=(llm.n_vocab(),))
        top2 = np.partition(logits, -2)[-2:]
        tok = int(np.argmax(logits))
        margins.append(float(top2[1] - top2[0]))
        if llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm._model.model), tok):
            break
        tokens.append(tok)
        if len(tokens) < n:
            llm.eval([tok])
    llm.reset()
    return PlainRun(tokens, margins)


def check_greedy(got: list[int], plain: PlainRun, *, exact: bool, delta: float = DELTA_TINY,
                 what: object = "") -> bool:
    """Asserts that `got` is plain decoding's output: identical when exact,
    else identical up to a position where plain decoding's top-2 margin is
    <= delta (DELTA_TINY or DELTA_SMOLLM2). Returns True when the runs parted
    at a near-tie."""
    ref = plain.tokens
    if exact:
        assert got == ref, (what, "exact output differs from plain decoding")
        return False
    n = min(len(got), len(ref))
    first = next((i for i in range(n) if got[i] != ref[i]), n)
    if first == len(got) == len(ref):
        return False
    # a different token, or one run ended (EOS) where the other went on
    assert first < len(plain.margins), (what, "output longer than plain decoding's")
    assert plain.margins[first] <= delta, (
        what, f"left plain decoding at token {first} where its top-2 margin is {plain.margins[first]:.4g} "
              f"> delta {delta:.4g}")
    return True


def plain_greedy_chain(llm: llama_cpp.Llama, prompt: list[int], n: int, *, grammar: str | None = None,
                       logit_bias: dict[int, float] | None = None, repeat_penalty: float = 1.0,
                       frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                       repeat_last_n: int = 64) -> PlainRun:
    """plain_greedy with llama-cpp-python's sampler chain in front of the argmax: logit bias,
    penalties and grammar, llama.cpp's own samplers in llama-cpp-python's order, each chosen
    token accepted (as Llama.generate's chain accepts it). Margins are the top-2 gaps of the
    logits the chain leaves (what greedy chose between)."""
    n_vocab = llm.n_vocab()
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if logit_bias:
        arr = (llama_cpp.llama_logit_bias * len(logit_bias))(*[llama_cpp.llama_logit_bias(int(t), float(b))
                                                                 for t, b in logit_bias.items()])
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(logit_bias),
                                                                                          arr))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_penalties(
        n_vocab, repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty))
    if grammar:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(),
                                                                                        b"root"))
    data = (llama_cpp.llama_token_data * n_vocab)()
    view = np.frombuffer(data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
    try:
        llm.reset()
        llm.eval(prompt)
        tokens: list[int] = []
        margins: list[float] = []
        for _ in range(n):
            row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
            view["id"] = np.arange(n_vocab)
            view["logit"] = np.ctypeslib.as_array(row, shape=(n_vocab,))
            cur = llama_cpp.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(chain, ctypes.byref(cur))
            shaped = view["logit"].copy()
            tok = int(np.argmax(shaped))
            top2 = np.partition(shaped, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
            llama_cpp.llama_sampler_accept(chain, tok)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
            tokens.append(tok)
            if len(tokens) < n:
                llm.eval([tok])
    finally:
        llama_cpp.llama_sampler_free(chain)
        llm.reset()
    return PlainRun(tokens, margins)


def chi_square_p(a_runs: list[tuple[int, ...]], b_runs: list[tuple[int, ...]], pos: int) -> float:
    """p-value of a chi-square test that the tokens at `pos` of two sets of runs follow one law
    (tokens seen fewer than 10 times pooled into one category)."""
    a = [r[pos] for r in a_runs if len(r) > pos]
    b = [r[pos] for r in b_runs if len(r) > pos]
    cats = sorted(set(a) | set(b))
    table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]])
    keep = table.sum(axis=0) >= 10
    table = np.column_stack([table[:, keep], table[:, ~keep].sum(axis=1)]) if (~keep).any() else table
    table = table[:, table.sum(axis=0) > 0]
    assert table.shape[1] >= 2, table
    return float(chi2_contingency(table)[1])
