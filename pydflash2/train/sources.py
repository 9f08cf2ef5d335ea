"""Training prompts from many sources, all made on this machine (no network).

- **Self-synthesis (Magpie)**: the target gets only its chat template's opening of a
  user turn and samples the user message itself (T 1, top-p 0.95), so the prompts
  follow the target's own idea of what users ask. Deterministic under a seed (one
  thread: llama.cpp's sampler is seeded and the CPU decode is repeatable).
- **Real-text seeds**: Python standard-library docstrings and source, Debian package
  descriptions (`apt-cache dumpavail`, else dpkg's status file) and man pages become
  explain / summarise / rewrite / code tasks.
- **Multi-turn**: the target answers a first prompt (greedy) and samples the second
  user turn itself after its answer; the line is the JSON conversation
  (`prompts.as_messages` reads it).

Every source goes through the same filter (length, template leakage) and the same
dedupe (normalised exact match, then word 3-gram Jaccard near-duplicates), which
also drops anything close to an excluded (held-out) prompt set.

    python -m pydflash2.train.sources --target smollm2 --out prompts_mixed.txt \\
        --magpie 200 --seeds 200 --multi-turn 50 --seed 0 [--exclude benchmarks/prompts_chat_eval.txt]
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import inspect
import json
import random
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

_SENTINEL = "\x00PDF2-USER-MESSAGE\x00"
_ROLE_START = re.compile(r"^\s*(user|assistant|system|human|ai|bot|question|answer)\s*[:\n]", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+")


# ------------------------------------------------------------------ filter and dedupe


def template_markers(llm) -> list[str]:  # noqa: ANN001  (a llama_cpp.Llama)
    """Strings that mean chat-template markup leaked into a text: every special (control or
    user-defined) token of the target, plus the usual delimiters."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out = {"<|", "|>", "[INST]", "[/INST]", "<s>", "</s>"}
    for tok in range(llm.n_vocab()):
        attr = llama_cpp.llama_vocab_get_attr(vocab, tok)
        if attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED):
            text = llm._model.token_get_text(tok)
            if len(text.strip()) > 1:
                out.add(text.strip())
    return sorted(out)


def clean_prompt(text: str, markers: Iterable[str], *, min_words: int = 3, max_words: int = 200,
                 max_chars: int = 1500) -> str | None:
    """The prompt stripped, or None if it is too short/long, holds template markup or reads like
    a transcript (a role name opening it)."""
    text = text.strip()
    n_words = len(text.split())
    if not (min_words <= n_words <= max_words) or len(text) > max_chars or not re.search(r"[A-Za-z]", text):
        return None
    if _ROLE_START.match(text) or any(m in text for m in markers):
        return None
    if "\ufffd" in text:  # a token cut in the middle of a UTF-8 character
        return None
    return text


def normalise(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def _shingles(norm: str, n: int = 3) -> set[str]:
    words = norm.split()
    if len(words) < n:
        return {norm}
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


class Deduper:
    """Keeps a text unless its normalised form was seen, or its word 3-gram set has Jaccard
    similarity >= threshold with a kept one (an inverted index finds the candidates)."""

    def __init__(self, threshold: float = 0.6) -> None:
        self.threshold = threshold
        self.exact: set[str] = set()
        self.sets: list[set[str]] = []
        self.index: dict[str, list[int]] = {}

    def add(self, text: str) -> bool:
        """True (and remembered) if new; False for a duplicate or near-duplicate."""
        norm = normalise(text)
        if not norm or norm in self.exact:
            return False
        sh = _shingles(norm)
        overlap: dict[int, int] = {}
        for s in sh:
            for j in self.index.get(s, ()):
                overlap[j] = overlap.get(j, 0) + 1
        for j, inter in overlap.items():
            if inter / (len(sh) + len(self.sets[j]) - inter) >= self.threshold:
                return False
        self.exact.add(norm)
        for s in sh:
            self.index.setdefault(s, []).append(len(self.sets))
        self.sets.append(sh)
        return True


def dedupe(texts: Iterable[str], threshold: float = 0.6, exclude: Iterable[str] = ()) -> list[str]:
    """texts in order without duplicates, near-duplicates, or anything near an `exclude` text."""
    d = Deduper(threshold)
    for t in exclude:
        d.add(t)
    return [t for t in texts if d.add(t)]


# ------------------------------------------------------------------ self-synthesis


def _render(llm, messages: list[dict[str, str]]) -> str:  # noqa: ANN001
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise ValueError("the target has no chat template: Magpie needs one")

    def text(tok: int) -> str:
        return "" if tok < 0 else llm._model.token_get_text(tok)

    fmt = Jinja2ChatFormatter(template=template, eos_token=text(llm.token_eos()), bos_token=text(llm.token_bos()))
    return fmt(messages=messages).prompt


def user_turn_opening(llm, history: list[dict[str, str]] = ()) -> list[int]:  # noqa: ANN001
    """Tokens of the chat template up to where the next user message's text would start
    (after `history`): the template rendered around a sentinel message, cut at the sentinel."""
    rendered = _render(llm, [*history, {"role": "user", "content": _SENTINEL}])
    if _SENTINEL not in rendered:
        raise ValueError("the chat template does not show the user's message")
    opening = rendered[: rendered.index(_SENTINEL)]
    return llm.tokenize(opening.encode("utf-8"), add_bos=llm.metadata.get("tokenizer.ggml.add_bos_token") == "true",
                        special=True)


class Synthesiser:
    """The target writing user messages (Magpie) and answering them, one thread, seeded."""

    def __init__(self, target: str | Path, *, n_threads: int = 1, n_ctx: int = 1024) -> None:
        import llama_cpp

        from ..llama_ext import silence_logs

        silence_logs()
        self.llm = llama_cpp.Llama(str(target), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                                   verbose=False)
        self.markers = template_markers(self.llm)

    def close(self) -> None:
        self.llm.close()

    def __enter__(self) -> Synthesiser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _complete(self, tokens: list[int], *, seed: int, temperature: float, top_p: float, max_tokens: int) -> str:
        self.llm.set_seed(seed)
        out = self.llm.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                         top_k=0, min_p=0.0, repeat_penalty=1.0, seed=seed)
        return out["choices"][0]["text"]

    def user_message(self, seed: int, history: list[dict[str, str]] = (), *, temperature: float = 1.0,
                     top_p: float = 0.95, max_tokens: int = 96) -> str | None:
        """One sampled user message (after `history`), or None if the filter rejects it."""
        text = self._complete(user_turn_opening(self.llm, list(history)), seed=seed, temperature=temperature,
                              top_p=top_p, max_tokens=max_tokens)
        return clean_prompt(text, self.markers)

    def answer(self, messages: list[dict[str, str]], max_tokens: int = 128) -> str:
        """The target's greedy reply, as the engine would write it."""
        rendered = _render(self.llm, messages)  # up to the assistant turn's opening
        toks = self.llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)
        return self._complete(toks, seed=0, temperature=0.0, top_p=1.0, max_tokens=max_tokens).strip()


def magpie_prompts(synth: Synthesiser, n: int, seed: int = 0, *, max_attempts: int | None = None,
                   dedup: Deduper | None = None, **sampling: float) -> list[str]:
    """n distinct self-synthesised first user messages (fewer if max_attempts, default 4n, run out)."""
    dedup = dedup or Deduper()
    out: list[str] = []
    for i in range(max_attempts or 4 * n):
        if len(out) >= n:
            break
        text = synth.user_message(seed * 1_000_003 + i, **sampling)
        if text is not None and dedup.add(text):
            out.append(text)
    return out


def multi_turn(synth: Synthesiser, firsts: list[str], seed: int = 0, *, dedup: Deduper | None = None,
               answer_tokens: int = 128) -> list[str]:
    """JSON conversations [user, assistant (the target's greedy answer), user (sampled by the target)]."""
    dedup = dedup or Deduper()
    out = []
    for i, first in enumerate(firsts):
        history = [{"role": "user", "content": first}]
        history.append({"role": "assistant", "content": synth.answer(history, answer_tokens)})
        for attempt in range(3):
            second = synth.user_message(seed * 1_000_003 + 7919 * i + attempt, history)
            if second is not None and dedup.add(second):
                out.append(json.dumps([*history, {"role": "user", "content": second}], ensure_ascii=False))
                break
    return out


# ------------------------------------------------------------------ real-text seeds

STDLIB_MODULES = (
    "json", "os", "os.path", "re", "itertools", "functools", "collections", "datetime", "pathlib", "random",
    "statistics", "textwrap", "string", "math", "shutil", "heapq", "bisect", "csv", "urllib.parse", "hashlib",
    "base64", "zipfile", "argparse", "logging", "dataclasses", "enum", "fractions", "decimal", "difflib", "uuid",
    "time", "calendar", "glob", "fnmatch", "tempfile", "copy", "pprint", "operator", "contextlib", "threading",
    "queue", "sqlite3", "secrets", "html", "email.utils", "ipaddress", "colorsys", "zlib", "struct", "unicodedata",
)

PY_DOC_TASKS = (
    "Explain what Python's `{name}` does and show a short example.",
    "When would I use `{name}` in Python? Give a practical example.",
    "Here is the documentation of Python's `{name}`:\n\n{doc}\n\nExplain it in plain words.",
    "Summarise this Python documentation in two sentences:\n\n{doc}",
    "Write a small Python program that uses `{name}`.",
    "What are common mistakes when using `{name}` in Python?",
)
PY_SRC_TASKS = (
    "Explain what this Python function does:\n\n```python\n{src}\n```",
    "Review this Python code and suggest improvements:\n\n```python\n{src}\n```",
    "Rewrite this function in a simpler way and explain the change:\n\n```python\n{src}\n```",
    "Write unit tests for this function:\n\n```python\n{src}\n```",
    "Could this function have a bug? Walk through it:\n\n```python\n{src}\n```",
)
PKG_TASKS = (
    "What is {pkg} used for? Here is its description: {desc}",
    "Summarise this software description in one sentence:\n\n{desc}",
    "Rewrite this package description so that a beginner understands it:\n\n{desc}",
    "I found a package called {pkg} ({short}). Should I install it, and what could I do with it?",
    "Write a short tutorial introduction for {pkg}, a tool described as: {short}.",
)
MAN_TASKS = (
    "What does the `{opt}` option of the `{cmd}` command do?",
    "Explain the command `{cmd}` ({what}) and give an example of how to use it.",
    "How do I use `{cmd} {opt}`? The manual says: {desc}",
    "Write a shell one-liner that uses `{cmd}` and explain it.",
)


def _first_paragraph(doc: str, max_chars: int = 600) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0].strip()
    return para[:max_chars]


def python_seeds() -> list[dict[str, str]]:
    """{name, doc, src} of public stdlib functions/classes that have a docstring (src: short source or '')."""
    out = []
    for mod_name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            if getattr(obj, "__module__", mod_name) not in (mod_name, mod.__name__):
                continue
            doc = inspect.getdoc(obj) or ""
            if len(doc.split()) < 6:
                continue
            src = ""
            if inspect.isfunction(obj):
                try:
                    lines = inspect.getsource(obj).splitlines()
                    if 4 <= len(lines) <= 30:
                        src = "\n".join(lines)
                except (OSError, TypeError):
                    pass
            out.append({"name": f"{mod_name}.{attr}", "doc": _first_paragraph(doc), "src": src})
    return out


def package_seeds(limit: int = 20000) -> list[dict[str, str]]:
    """{pkg, short, desc} from apt's package lists (apt-cache dumpavail), else dpkg's status file."""
    try:
        text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, timeout=120,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    if not text.strip():
        status = Path("/var/lib/dpkg/status")
        text = status.read_text(errors="replace") if status.exists() else ""
    out = []
    for stanza in text.split("\n\n"):
        pkg = re.search(r"^Package: (\S+)", stanza, re.MULTILINE)
        desc = re.search(r"^Description(?:-en)?: (.*)((?:\n .*)*)", stanza, re.MULTILINE)
        if not pkg or not desc:
            continue
        long = " ".join(ln.strip() for ln in desc.group(2).splitlines() if ln.strip() and ln.strip() != ".")
        if len(long.split()) < 12:
            continue
        out.append({"pkg": pkg.group(1), "short": desc.group(1).strip(), "desc": long[:700]})
        if len(out) >= limit:
            break
    return out


def _troff_text(s: str) -> str:
    s = re.sub(r"\\f[BIRP]|\\f\(..|\\f\[[^]]*\]|\\[,/&]", "", s)
    return s.replace("\\-", "-").replace("\\(aq", "'").replace("\\(dq", '"').replace("\\e", "\\").strip()


def man_seeds(man_dir: str | Path = "/usr/share/man/man1", limit: int = 3000) -> list[dict[str, str]]:
    """{cmd, what, opt, desc} from section-1 man pages: the NAME line and the first options."""
    out: list[dict[str, str]] = []
    for path in sorted(Path(man_dir).glob("*.1*.gz"))[:limit]:
        try:
            lines = gzip.open(path, "rt", errors="replace").read().splitlines()
        except (OSError, EOFError):
            continue
        what, cmd = "", ""
        for i, ln in enumerate(lines):
            if ln.startswith(".SH") and "NAME" in ln and i + 1 < len(lines):
                m = re.match(r"(.+?)\s+\\?-\s+(.+)", _troff_text(lines[i + 1]))
                if m:
                    cmd, what = m.group(1).split(",")[0].strip(), m.group(2).strip()
                break
        if not cmd or not re.fullmatch(r"[\w.+-]+", cmd):
            continue
        for i, ln in enumerate(lines[:-2]):
            if ln.startswith(".TP"):
                opt = _troff_text(lines[i + 1]).split(",")[0].split("=")[0].strip()
                desc = _troff_text(lines[i + 2])
                if re.fullmatch(r"--?[\w-]+", opt) and len(desc.split()) >= 3 and not desc.startswith("."):
                    out.append({"cmd": cmd, "what": what, "opt": opt, "desc": desc[:300]})
                    break
        else:
            out.append({"cmd": cmd, "what": what, "opt": "", "desc": what})
    return out


def seed_prompts(n: int, seed: int = 0, *, markers: Iterable[str] = ()) -> list[str]:
    """n tasks made from real text on this machine, a third from each source where it has enough."""
    rng = random.Random(seed)
    py, pkgs, man = python_seeds(), package_seeds(), man_seeds()
    rng.shuffle(py)
    rng.shuffle(pkgs)
    rng.shuffle(man)

    def from_py(s: dict[str, str]) -> str:
        if s["src"] and rng.random() < 0.4:
            return rng.choice(PY_SRC_TASKS).format(src=s["src"])
        return rng.choice(PY_DOC_TASKS).format(name=s["name"], doc=s["doc"])

    def from_pkg(s: dict[str, str]) -> str:
        return rng.choice(PKG_TASKS).format(**s)

    def from_man(s: dict[str, str]) -> str:
        tasks = MAN_TASKS if s["opt"] else MAN_TASKS[1:2] + MAN_TASKS[3:]
        return rng.choice(tasks).format(**s)

    streams = [iter(map(from_py, py)), iter(map(from_pkg, pkgs)), iter(map(from_man, man))]
    out, d = [], Deduper()
    while len(out) < n and streams:
        for it in list(streams):
            text = next(it, None)
            if text is None:
                streams.remove(it)
                continue
            text = clean_prompt(text, markers, max_words=250, max_chars=2000)
            if text is not None and d.add(text) and len(out) < n:
                out.append(text)
    return out


# ------------------------------------------------------------------ command line


def prompt_line(prompt: str) -> str:
    """A prompt as one line of a prompt file: multi-line text as a one-message JSON conversation."""
    return json.dumps([{"role": "user", "content": prompt}], ensure_ascii=False) if "\n" in prompt else prompt


def main(argv: list[str] | None = None) -> int:
    from ..models import resolve_target
    from .prompts import TRAIN_FILE, read_prompts

    ap = argparse.ArgumentParser(prog="python -m pydflash2.train.sources", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target GGUF (or smollm2)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--magpie", type=int, default=0, help="self-synthesised first user messages")
    ap.add_argument("--seeds", type=int, default=0, help="tasks made from stdlib docs, package descriptions, man pages")
    ap.add_argument("--multi-turn", type=int, default=0, help="two-turn conversations (first turn: Magpie)")
    ap.add_argument("--templates", type=int, default=0,
                    help="also this many prompts of the built-in template-made training prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--exclude", action="append", default=[], help="prompt file(s) nothing may come near")
    a = ap.parse_args(argv)
    target = resolve_target(a.target) if a.target == "smollm2" else Path(a.target)
    exclude = [p for f in a.exclude for p in read_prompts(f)]
    d = Deduper()
    for t in exclude:
        d.add(t)
    with Synthesiser(target, n_threads=a.threads) as synth:
        magpie = magpie_prompts(synth, a.magpie, a.seed, dedup=d) if a.magpie else []
        firsts = magpie_prompts(synth, a.multi_turn, a.seed + 1, dedup=d) if a.multi_turn else []
        conv = multi_turn(synth, firsts, a.seed, dedup=d) if firsts else []
        markers = synth.markers
    seeds = [s for s in seed_prompts(a.seeds, a.seed, markers=markers) if d.add(s)] if a.seeds else []
    templates = random.Random(a.seed).sample(read_prompts(TRAIN_FILE), a.templates) if a.templates else []
    tagged = ([(prompt_line(p), "magpie") for p in magpie] + [(prompt_line(p), "seeds") for p in seeds]
              + [(c, "multi-turn") for c in conv] + [(p, "templates") for p in templates])
    random.Random(a.seed).shuffle(tagged)
    Path(a.out).write_text("".join(line + "\n" for line, _ in tagged), encoding="utf-8")
    # which source each line (prompt index) came from, for ablations by source
    Path(a.out + ".sources.json").write_text(json.dumps({i: src for i, (_, src) in enumerate(tagged)}))
    print(f"{a.out}: {len(magpie)} self-synthesised, {len(seeds)} from real-text seeds, {len(conv)} multi-turn, "
          f"{len(templates)} from templates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
