"""An Ollama Modelfile for a target + DFlash/DFlash2 drafter pair.

`ollama create NAME -f Modelfile` (Ollama >= 0.30) runs a `dflash` GGUF named by
DRAFT as llama.cpp's `--spec-type draft-dflash`, drafting `draft_num_predict`
tokens per block. What the Modelfile holds comes from the files themselves:
the drafter's block size, the target's end-of-generation tokens as llama.cpp
determines them, and its chat template where an Ollama Go template with the
same output is known (go_template.py).
"""

from __future__ import annotations

import ctypes
import filecmp
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..info import DrafterFileError, inspect_drafter
from ..models import resolve_target
from .go_template import derive_ollama_template

DEFAULT_NUM_CTX = 4096


class ModelfileError(ValueError):
    """The pair cannot be written as a Modelfile: a missing or unreadable file, a
    drafter that does not fit the target, a bad option, a bundle conflict."""


class ModelfileWarning(UserWarning):
    """Written anyway, but worth knowing (a clamped draft length, a layer tap
    that upstream llama.cpp cannot serve on every architecture)."""


@dataclass
class TargetFacts:
    """What the Modelfile needs from the target, as llama.cpp reads it."""

    n_embd: int
    n_layer: int
    n_vocab: int
    n_ctx_train: int
    stop: list[str]  # texts of the end-of-generation tokens, by token id
    chat_template: str | None
    bos_token: str
    eos_token: str
    arch: str = ""  # general.architecture

    def fit(self, path: Path, hp: dict) -> tuple[list[str], list[str]]:
        """Whether the drafter whose numbers hp holds (inspect_drafter's) fits this target
        at path: the converter's own checks (pydflash2.convert.validate.gguf_fit), as
        (problems, warnings)."""
        from ..convert.target import Target
        from ..convert.validate import gguf_fit

        return gguf_fit(hp, Target(path, "gguf", self.n_embd, self.n_layer, self.n_vocab))


def read_target(path: Path) -> TargetFacts:
    """Loads the target's metadata and vocabulary only (no weights, and much faster
    than gguf-py on a 150k-token vocabulary) through the pinned llama.cpp, so the
    stop tokens are exactly those its llama_vocab_is_eog accepts (eos, eot, eom,
    <|im_end|>-like and FIM tokens, after its own corrections)."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    try:
        model = LlamaModel(path_model=os.fspath(path), params=params, verbose=False)
    except ValueError as e:
        raise ModelfileError(f"llama.cpp cannot load {path}: {e}") from None
    try:
        meta = model.metadata()  # with vocab_only llama.cpp skips the hparams, not the key/value pairs
        arch = meta.get("general.architecture", "")
        if arch == "dflash":
            raise ModelfileError(f"{path} is a DFlash drafter, not a target model")

        def number(key: str, required: bool = True) -> int:
            try:
                return int(meta[f"{arch}.{key}"])
            except (KeyError, ValueError):
                if required:
                    raise ModelfileError(f"target {path} lacks {arch}.{key}") from None
                return 0

        n_vocab = model.n_vocab()

        def text(tok: int) -> str:
            """The token as llama.cpp prints it, special tokens included."""
            if not 0 <= tok < n_vocab:
                return ""
            size = 64
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(model.vocab, tok, buf, size, 0, True)
                if n >= 0:
                    return buf.raw[:n].decode("utf-8", errors="replace")
                size = -n  # llama.cpp returns minus the size it needs

        stop = []
        for tok in range(n_vocab):
            if llama_cpp.llama_vocab_is_eog(model.vocab, tok):
                piece = text(tok)
                if piece and piece not in stop:
                    stop.append(piece)
        template = llama_cpp.llama_model_chat_template(model.model, None)
        return TargetFacts(
            n_embd=number("embedding_length"),
            n_layer=number("block_count"),
            n_vocab=n_vocab,
            n_ctx_train=number("context_length", required=False),
            stop=stop,
            chat_template=template.decode("utf-8") if template else None,
            bos_token=text(model.token_bos()),
            eos_token=text(model.token_eos()),
            arch=arch,
        )
    finally:
        model.close()


def quote(value: str) -> str:
    """A Modelfile argument that Ollama's parser reads back as `value`: bare when it
    has no whitespace, else in "..." or \"\"\"...\"\"\" (parser/parser.go ends a
    quoted value at the first line break after which the quotes balance)."""
    if any(not (c.isprintable() or c in " \t\n") for c in value):
        raise ModelfileError(f"{value!r} holds characters a Modelfile cannot carry")
    if value and not any(c.isspace() for c in value) and not value.startswith('"'):
        return value
    breaks = [i for i, c in enumerate(value) if c == "\n"]
    single_ok = not value.startswith('""') and not any(value[:i].rstrip().endswith('"') for i in breaks)
    triple_ok = not any(value[:i].rstrip().endswith('"""') for i in breaks)
    if triple_ok and (breaks or not single_ok):  # """ is the usual way to write a multi-line value
        return f'"""{value}"""'
    if single_ok:
        return f'"{value}"'
    raise ModelfileError(f"{value!r} cannot be quoted for a Modelfile")


def _resolve_drafter(draft: str | os.PathLike[str] | None) -> Path:
    if draft is not None:
        return Path(draft)
    from .. import models

    default = getattr(models, "default_drafter", None)
    if default is None:
        raise ModelfileError("no drafter given (draft= / --draft D.gguf), and no default drafter is shipped")
    return Path(default())


def _check_fit(target_path: Path, facts: TargetFacts, draft_path: Path, hp: dict) -> None:
    """The converter's own target/drafter checks, on the drafter GGUF's numbers."""
    problems, notes = facts.fit(target_path, hp)
    if problems:
        raise ModelfileError(f"drafter {draft_path} does not fit target {target_path}: {'; '.join(problems)}")
    for w in notes:
        warnings.warn(w, ModelfileWarning, stacklevel=3)


def _bundle_paths(files: list[Path], folder: Path) -> list[Path]:
    """Where --bundle puts each file: in folder, under its own name (numbered when
    target and drafter are both called model.gguf)."""
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        names = [f"{i}-{n}" for i, n in enumerate(names)]
    return [(folder / n).absolute() for n in names]


def _link_or_copy(pairs: list[tuple[Path, Path]]) -> None:
    """Hard-links each src to its dst (a copy across file systems). A file already at
    dst is kept if identical; one that differs stops everything before anything is made."""
    for src, dst in pairs:
        if dst.exists() and not (os.path.samefile(src, dst) or filecmp.cmp(src, dst, shallow=False)):
            raise ModelfileError(f"{dst} exists and differs from {src}; remove it or bundle elsewhere")
    for src, dst in pairs:
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def modelfile(
    model: str | os.PathLike[str] = "smollm2",
    draft: str | os.PathLike[str] | None = None,
    *,
    n_max: int | None = None,
    num_ctx: int | None = None,
    bundle: str | os.PathLike[str] | None = None,
) -> str:
    """The text of an Ollama Modelfile that runs `model` with `draft` as its DFlash drafter.

    model: target GGUF, or "smollm2" for the default target. draft: drafter GGUF
    (default: the default drafter where one is shipped). n_max: draft_num_predict,
    clamped to the drafter's block_size - 1 (default: block_size - 1). num_ctx:
    context length (default: 4096 or the target's training context if smaller).
    bundle: a folder to hard-link or copy both files into; the Modelfile then
    refers to them there (a drafter inside site-packages dies with its venv).

    Raises ModelfileError for a missing file, a drafter that breaks the dflash
    contract or does not fit the target (the converter's checks), or a bad value.
    """
    try:
        target_path = Path(resolve_target(model)).absolute()
        draft_path = _resolve_drafter(draft).absolute()
    except FileNotFoundError as e:  # a default model whose package is not installed
        raise ModelfileError(str(e)) from None
    for kind, p in (("target", target_path), ("drafter", draft_path)):
        if not p.is_file():
            raise ModelfileError(f"{kind} {p} does not exist" if not p.exists() else f"{kind} {p} is not a file")
    if n_max is not None and n_max < 1:
        raise ModelfileError(f"n_max must be >= 1 (Ollama drafts nothing at 0), got {n_max}")
    if num_ctx is not None and num_ctx < 1:
        raise ModelfileError(f"num_ctx must be >= 1, got {num_ctx}")
    try:
        hp = inspect_drafter(draft_path)
    except DrafterFileError as e:
        raise ModelfileError(f"{draft_path} is not a usable drafter: {e}") from None
    facts = read_target(target_path)
    _check_fit(target_path, facts, draft_path, hp)

    max_draft = int(hp["block_size"]) - 1
    if n_max is None:
        n_max = max_draft
    elif n_max > max_draft:
        warnings.warn(f"n_max {n_max} clamped to the drafter's block_size - 1 = {max_draft}", ModelfileWarning,
                      stacklevel=2)
        n_max = max_draft
    if num_ctx is None:
        num_ctx = min(DEFAULT_NUM_CTX, facts.n_ctx_train) if facts.n_ctx_train > 0 else DEFAULT_NUM_CTX
    template = None
    if facts.chat_template:
        template = derive_ollama_template(facts.chat_template, facts.bos_token, facts.eos_token)
    sources = [target_path, draft_path]
    if bundle is not None:
        target_path, draft_path = _bundle_paths(sources, Path(bundle))

    from .. import __version__

    kind = "DFlash2" if hp["version"] == 2 else "DFlash"
    lines = [
        f"# Ollama Modelfile written by pydflash2 {__version__} (needs Ollama >= 0.30 for DRAFT)",
        "#   ollama create NAME -f Modelfile && ollama run NAME",
        f"# drafter: {kind}, block size {hp['block_size']}",
        f"FROM {quote(str(target_path))}",
        f"DRAFT {quote(str(draft_path))}",
        f"PARAMETER draft_num_predict {n_max}",
        f"PARAMETER num_ctx {num_ctx}",
        *(f"PARAMETER stop {quote(s)}" for s in facts.stop),
    ]
    if template is None:
        lines.append("# no TEMPLATE: Ollama uses the target's own chat template")
    else:
        lines.append(f"# TEMPLATE: Ollama's {template.name} template, same output as the target's chat template")
        lines.append(f"TEMPLATE {quote(template.go_template)}")
        if template.default_system is not None:
            lines.append(f"SYSTEM {quote(template.default_system)}")
    if bundle is not None:  # only once the text is known to be writable
        _link_or_copy(list(zip(sources, (target_path, draft_path), strict=True)))
    return "\n".join(lines) + "\n"
