"""One-sample tests of sampled output against the target's exact law.

The law of each token is computed, for the prefix the draw actually took, from the target's
logits (plain batch-1 llama.cpp decoding on a Llama of its own, no pydflash2 code) through
llama.cpp's own sampler chain in llama-cpp-python's order: logit bias, penalties, grammar,
top-k, typical, top-p, min-p, temperature (llama_sampler_* via llama_cpp). The history-dependent
samplers (penalties, grammar) get the prefix's generated tokens accepted into a fresh chain, as
Llama.generate accepts each sampled token. The dist sampler then draws from the softmax of the
logits the chain leaves: that softmax is the law.

The test is a chi-square goodness of fit of the joint law of the first K tokens, decomposed into
its conditionals: per step k and per distinct prefix of k drawn tokens (with enough draws), the
observed next tokens against n * p(.|prefix) (cells with expected counts under 5 pooled); the
statistics and degrees of freedom add up. A token the law gives probability 0 (a grammar or
top-p cut) fails it outright. End of generation (any EOG token) is one category.

sequential_test draws in chunks until the test rejects a deliberately wrong law at p < 0.001
(so it has the power to see that mistake: the number of draws it needed is printed), then
tests the true law on the same draws.

On a stock (not batch-invariant) build verification's batched logits differ from batch-1
logits by at most 0.0112 on the tiny target (tests/lossless.py): probabilities by ~1%, far
below what a few thousand draws can resolve.
"""

from __future__ import annotations

import ctypes
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import llama_cpp
import numpy as np
from scipy.stats import chi2

ALPHA = 0.001
MIN_GROUP = 20  # draws a prefix needs for its conditional to be tested
MIN_EXPECTED = 5.0

Draw = tuple[int, ...]


@dataclass(frozen=True)
class Chain:
    """A sampler chain's settings, in Speculator.generate's words."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    grammar: str | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    # a deliberately wrong law only: the temperature before the filters instead of after them
    temperature_first: bool = False

    def kwargs(self) -> dict[str, Any]:
        assert not self.temperature_first, "a wrong law's chain is not a request"
        kw: dict[str, Any] = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                                  repeat_penalty=self.repeat_penalty, frequency_penalty=self.frequency_penalty,
                                  presence_penalty=self.presence_penalty, repeat_last_n=self.repeat_last_n)
        if self.grammar is not None:
            kw["grammar"] = self.grammar
        if self.logit_bias:
            kw["logit_bias"] = dict(self.logit_bias)
        return kw

    def but(self, **changes: Any) -> Chain:
        return replace(self, **changes)


class TargetLogits:
    """The target's next-token logits after prompt + prefix, decoded batch-1 by llama.cpp on a
    Llama of its own (the prompt once, then the prefix a token at a time), memoized per prefix."""

    def __init__(self, model_path: str, prompt: Sequence[int], *, flash_attn: bool = False) -> None:
        self.llm = llama_cpp.Llama(model_path, n_ctx=512, n_batch=512, n_threads=1, n_threads_batch=1,
                                   flash_attn=flash_attn, verbose=False)
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = self.llm.n_vocab()
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.eog = np.array([bool(llama_cpp.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)])
        self.prompt = list(prompt)
        self._cache: dict[Draw, np.ndarray] = {}
        self._held: Draw = ()  # the prefix whose K/V follow the prompt's in the cache
        llama_cpp.llama_memory_clear(self.mem, True)
        self._decode(self.prompt)
        self._cache[()] = self._last()

    def _decode(self, tokens: list[int]) -> None:
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        assert llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(arr, len(tokens))) == 0

    def _last(self) -> np.ndarray:
        row = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).astype(np.float32)

    def __call__(self, prefix: Draw) -> np.ndarray:
        if prefix in self._cache:
            return self._cache[prefix]
        common = 0
        while common < min(len(prefix), len(self._held)) and prefix[common] == self._held[common]:
            common += 1
        llama_cpp.llama_memory_seq_rm(self.mem, 0, len(self.prompt) + common, -1)
        for i in range(common, len(prefix)):
            self._decode([prefix[i]])  # batch-1, as plain decoding
            self._cache[prefix[: i + 1]] = self._last()
        self._held = prefix
        return self._cache[prefix]

    def close(self) -> None:
        self.llm.close()


class ExactLaw:
    """p(next token | prefix of generated tokens) under a chain, over the vocabulary plus one
    END category (index n_vocab: every EOG token's mass)."""

    def __init__(self, logits: TargetLogits, chain: Chain) -> None:
        self.logits = logits
        self.chain = chain
        self.END = logits.n_vocab
        self._cache: dict[Draw, np.ndarray] = {}
        n = logits.n_vocab
        self._data = (llama_cpp.llama_token_data * n)()
        self._view = np.frombuffer(self._data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))

    def _sampler(self) -> Any:
        c, lg = self.chain, self.logits
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

        def add(s: Any) -> None:
            llama_cpp.llama_sampler_chain_add(chain, s)

        if c.logit_bias:
            arr = (llama_cpp.llama_logit_bias * len(c.logit_bias))(
                *[llama_cpp.llama_logit_bias(int(t), float(b)) for t, b in c.logit_bias.items()])
            add(llama_cpp.llama_sampler_init_logit_bias(lg.n_vocab, len(c.logit_bias), arr))
        add(llama_cpp.llama_sampler_init_penalties(lg.n_vocab, c.repeat_last_n, c.repeat_penalty, c.frequency_penalty,
                                                   c.presence_penalty))
        if c.grammar is not None:
            add(llama_cpp.llama_sampler_init_grammar(lg.vocab, c.grammar.encode(), b"root"))
        if c.temperature_first:
            add(llama_cpp.llama_sampler_init_temp(c.temperature))
        add(llama_cpp.llama_sampler_init_top_k(c.top_k))
        add(llama_cpp.llama_sampler_init_typical(1.0, 1))
        add(llama_cpp.llama_sampler_init_top_p(c.top_p, 1))
        add(llama_cpp.llama_sampler_init_min_p(c.min_p, 1))
        if not c.temperature_first:
            add(llama_cpp.llama_sampler_init_temp(c.temperature))
        return chain

    def __call__(self, prefix: Draw) -> np.ndarray:
        if prefix in self._cache:
            return self._cache[prefix]
        if prefix:  # the chain's history must be one the law allows (a grammar cannot accept the rest)
            parent = self(prefix[:-1])
            assert parent[prefix[-1]] > 0, f"prefix {prefix} has probability 0 under {self.chain}"
        n = self.logits.n_vocab
        sampler = self._sampler()
        try:
            for tok in prefix:
                llama_cpp.llama_sampler_accept(sampler, tok)
            self._view["id"] = np.arange(n)
            self._view["logit"] = self.logits(prefix)
            cur = llama_cpp.llama_token_data_array(data=self._data, size=n, selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(cur))
            kept = self._view[: cur.size]
            ids, lg = kept["id"].astype(np.int64), kept["logit"].astype(np.float64)
        finally:
            llama_cpp.llama_sampler_free(sampler)
        p = np.zeros(n + 1)
        finite = np.isfinite(lg)
        w = np.exp(lg[finite] - lg[finite].max())
        p[ids[finite]] = w / w.sum()
        p[self.END] = p[:n][self.logits.eog].sum()
        p[:n][self.logits.eog] = 0.0
        self._cache[prefix] = p
        return p


@dataclass
class Fit:
    statistic: float
    df: int
    p: float
    groups: int
    impossible: list[tuple[Draw, int]]


def goodness_of_fit(draws: Sequence[Draw], law: ExactLaw, n_steps: int) -> Fit:
    """The pooled chi-square test of draws (tuples of up to n_steps tokens, END last if they
    ended) against law's joint law of the first n_steps tokens."""
    stat, df, groups = 0.0, 0, 0
    impossible: list[tuple[Draw, int]] = []
    for k in range(n_steps):
        by_prefix: dict[Draw, Counter[int]] = defaultdict(Counter)
        for d in draws:
            if len(d) > k and (k == 0 or d[k - 1] != law.END):
                by_prefix[d[:k]][d[k]] += 1
        for prefix, seen in by_prefix.items():
            n = sum(seen.values())
            if n < MIN_GROUP or any(law(prefix[:i])[prefix[i]] == 0 for i in range(len(prefix))):
                # too few draws, or a prefix already counted as impossible one step earlier
                continue
            p = law(prefix)
            impossible += [(prefix, t) for t in seen if p[t] == 0]
            expected = n * p
            order = np.argsort(-expected)
            cells_o: list[float] = []
            cells_e: list[float] = []
            for t in order:
                if expected[t] < MIN_EXPECTED:
                    break
                cells_o.append(seen.get(int(t), 0))
                cells_e.append(float(expected[t]))
            rest_e = n - sum(cells_e)
            rest_o = n - sum(cells_o)
            if rest_e >= MIN_EXPECTED or (not cells_e and rest_e > 0):
                cells_o.append(rest_o)
                cells_e.append(rest_e)
            elif cells_e:  # a tail too small for a cell of its own joins the smallest one
                cells_o[-1] += rest_o
                cells_e[-1] += rest_e
            if len(cells_e) < 2:
                continue
            o, e = np.asarray(cells_o), np.asarray(cells_e)
            stat += float(((o - e) ** 2 / e).sum())
            df += len(cells_e) - 1
            groups += 1
    p_value = 0.0 if impossible else (float(chi2.sf(stat, df)) if df else 1.0)
    return Fit(stat, df, p_value, groups, impossible)


def sequential_test(draw: Callable[[int], Draw], true: ExactLaw, wrong: ExactLaw, n_steps: int, *,
                    chunk: int = 200, max_draws: int = 6000, what: object = "") -> list[Draw]:
    """Draws draw(seed) for seeds 0, 1, ... in chunks until the test rejects `wrong` at p <
    ALPHA (failing if max_draws never do), then asserts that `true` passes on the same draws.
    Returns the draws."""
    draws: list[Draw] = []
    while True:
        draws += [draw(seed) for seed in range(len(draws), len(draws) + chunk)]
        against_wrong = goodness_of_fit(draws, wrong, n_steps)
        if against_wrong.p < ALPHA:
            break
        assert len(draws) < max_draws, (what, f"{len(draws)} draws never told the wrong law {wrong.chain} apart "
                                              f"(p={against_wrong.p:.3g}): the test has no power here")
    fit = goodness_of_fit(draws, true, n_steps)
    print(f"{what}: the wrong law rejected after {len(draws)} draws (p={against_wrong.p:.2g}, "
          f"chi2 {against_wrong.statistic:.1f} on {against_wrong.df} df); the true law: p={fit.p:.3g} "
          f"(chi2 {fit.statistic:.1f} on {fit.df} df, {fit.groups} conditionals)")
    assert not fit.impossible, (what, "drew tokens the law forbids (prefix, token)", fit.impossible[:5])
    assert fit.p > ALPHA, (what, fit)
    return draws


def as_draw(tokens: Sequence[int], ended: bool, end: int, n_steps: int) -> Draw:
    """A generation's first n_steps tokens, END appended where it ended (at EOG) before them."""
    out = tuple(int(t) for t in tokens[:n_steps])
    return out + (end,) if ended and len(out) < n_steps else out


class SpeculatorDraws:
    """draw(seed) for sequential_test: the first n_steps tokens of spec.generate(prompt, seed=seed)
    under a chain, counting the drafts verification reached and accepted."""

    def __init__(self, spec: Any, prompt: Sequence[int], chain: Chain, end: int, n_steps: int) -> None:
        self.spec, self.prompt, self.chain, self.end, self.n_steps = spec, list(prompt), chain, end, n_steps
        self.drafted = self.accepted = 0

    def __call__(self, seed: int) -> Draw:
        out = self.spec.generate(self.prompt, max_tokens=self.n_steps, seed=seed, **self.chain.kwargs())
        self.drafted += sum(out.stats["drafted_per_position"])
        self.accepted += sum(out.stats["accepted_per_position"])
        return as_draw(out.tokens, out.finish_reason == "eos", self.end, self.n_steps)

