"""Ollama's Modelfile reader, ported to Python for the tests: parser/parser.go
(ParseFile: a rune-by-rune state machine; Modelfile.CreateRequest) and the
parameter validation of api/types.go (FormatParams over the Options struct),
as of ollama/ollama fb30760 (2026-08). Error messages are Ollama's.

Also a reader for the small subset of Go's text/template that Ollama's ChatML
template uses, so a test can check what a TEMPLATE renders.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

COMMANDS = ("from", "license", "template", "system", "adapter", "draft", "renderer", "parser", "parameter",
            "message", "requires")
MESSAGE_ROLES = ("system", "user", "assistant")
ERR_INVALID_COMMAND = ('command must be one of "from", "license", "template", "system", "adapter", "draft", '
                       '"renderer", "parser", "parameter", "message", or "requires"')
ERR_INVALID_ROLE = 'message role must be one of "system", "user", or "assistant"'

# api.Options and api.Runner: json tag -> Go kind (main_gpu is *int, use_mmap *bool)
PARAMETER_KINDS = {
    "num_keep": "int", "seed": "int", "num_predict": "int", "top_k": "int", "top_p": "float", "min_p": "float",
    "typical_p": "float", "repeat_last_n": "int", "temperature": "float", "repeat_penalty": "float",
    "presence_penalty": "float", "frequency_penalty": "float", "stop": "slice",
    "num_ctx": "int", "num_batch": "int", "num_gpu": "int", "main_gpu": "int", "use_mmap": "bool",
    "num_thread": "int", "draft_num_predict": "int",
}
DEPRECATED_PARAMETERS = ("penalize_newline", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock",
                         "mirostat", "mirostat_tau", "mirostat_eta")


class ParserError(Exception):
    """parser.ParserError: a bad command or message role, with its line."""

    def __init__(self, line: int, msg: str) -> None:
        super().__init__(f"(line {line}): {msg}" if line > 0 else msg)


class UnexpectedEOF(Exception):
    """io.ErrUnexpectedEOF: a command without a value, or an unterminated quote."""


class MissingFrom(Exception):
    """errMissingFrom."""


class CreateError(Exception):
    """An error of Modelfile.CreateRequest (unknown parameter, bad value, bad path...)."""


NIL, NAME, VALUE, PARAMETER, MESSAGE, COMMENT = range(6)


def _is_alpha(r: str) -> bool:
    return "a" <= r <= "z" or "A" <= r <= "Z"


def _is_space(r: str) -> bool:
    return r in " \t"


def _is_newline(r: str) -> bool:
    return r in "\r\n"


def _next_state(r: str, state: int, line: int) -> tuple[int, str | None]:
    """parseRuneForState: the next state and the rune to keep (None for Go's 0)."""
    if state == NIL:
        if r == "#":
            return COMMENT, None
        if _is_space(r) or _is_newline(r):
            return NIL, None
        return NAME, r
    if state == NAME:
        if _is_alpha(r):
            return NAME, r
        if _is_space(r):
            return VALUE, None
        raise ParserError(line, ERR_INVALID_COMMAND)
    if state == VALUE:
        return (NIL, r) if _is_newline(r) or _is_space(r) else (VALUE, r)
    if state == PARAMETER:
        if _is_alpha(r) or "0" <= r <= "9" or r == "_":
            return PARAMETER, r
        if _is_space(r):
            return VALUE, None
        raise UnexpectedEOF
    if state == MESSAGE:
        if _is_alpha(r):
            return MESSAGE, r
        if _is_space(r):
            return VALUE, None
        raise UnexpectedEOF
    if _is_newline(r):  # COMMENT
        return NIL, None
    return COMMENT, None


def unquote(s: str) -> tuple[str, bool]:
    if s[:3] == '"""':
        if len(s) >= 6 and s[-3:] == '"""':
            return s[3:-3], True
        return "", False
    if s[:1] == '"':
        if len(s) >= 2 and s[-1] == '"':
            return s[1:-1], True
        return "", False
    return s, True


def parse(text: str) -> list[tuple[str, str]]:
    """parser.ParseFile: the commands as (name, args); FROM is named "model" and a
    PARAMETER by its key, MESSAGE args are "role: content"."""
    commands: list[tuple[str, str]] = []
    name, role, buf = "", "", []
    state, line = NIL, 1
    for r in text.removeprefix("\ufeff"):
        if _is_newline(r):
            line += 1
        try:
            nxt, keep = _next_state(r, state, line)
        except UnexpectedEOF:
            raise UnexpectedEOF("".join(buf)) from None
        if nxt != state:
            word = "".join(buf)
            if state == NAME:
                if word.lower() not in COMMANDS:
                    raise ParserError(line, ERR_INVALID_COMMAND)
                s = word.lower()
                if s == "from":
                    name = "model"
                elif s == "parameter":
                    nxt = PARAMETER
                else:
                    if s == "message":
                        nxt = MESSAGE
                    name = s
            elif state == PARAMETER:
                name = word
            elif state == MESSAGE:
                if word not in MESSAGE_ROLES:
                    raise ParserError(line, ERR_INVALID_ROLE)
                role = word
            elif state == VALUE:
                value, ok = unquote(word.strip())
                if not ok or _is_space(r):  # a space never ends a value; a line break ends a balanced one
                    buf.append(r)
                    continue
                if role:
                    value, role = f"{role}: {value}", ""
                commands.append((name, value))
            buf.clear()
            state = nxt
        if keep is not None and keep.isprintable():  # strconv.IsPrint
            buf.append(keep)
    if state == VALUE:
        value, ok = unquote("".join(buf).strip())
        if not ok:
            raise UnexpectedEOF("".join(buf))
        commands.append((name, f"{role}: {value}" if role else value))
    elif state not in (NIL, COMMENT):
        raise UnexpectedEOF("".join(buf))
    if not any(n == "model" for n, _ in commands):
        raise MissingFrom("no FROM line")
    return commands


def _expand_path(path: str, relative_dir: str) -> str:
    if os.path.isabs(path):
        return os.path.abspath(path)
    if path.startswith("~"):
        return os.path.abspath(os.path.expanduser(path))
    return os.path.abspath(os.path.join(relative_dir, path))


_SEMVER = re.compile(
    r"v(0|[1-9]\d*)(\.(0|[1-9]\d*)(\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?)?)?"
)
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)
_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
          "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


def format_param(key: str, value: str) -> Any:
    """api.FormatParams for one key: the typed value, or Ollama's error."""
    kind = PARAMETER_KINDS.get(key)
    if kind is None:
        raise CreateError(f"unknown parameter '{key}'")
    if kind == "int":
        if not re.fullmatch(r"[+-]?\d+", value) or not -(2**63) <= int(value) < 2**63:
            raise CreateError(f"invalid int value [{value}]")
        return int(value)
    if kind == "float":
        if not _FLOAT.fullmatch(value) or (abs(float(value)) > 3.4028234663852886e38
                                           and "inf" not in value.lower()):
            raise CreateError(f"invalid float value [{value}]")
        return float(value)
    if kind == "bool":
        if value not in _BOOLS:
            raise CreateError(f"invalid bool value [{value}]")
        return _BOOLS[value]
    return [value]


def create_request(commands: list[tuple[str, str]], relative_dir: str | Path) -> dict[str, Any]:
    """Modelfile.CreateRequest: what `ollama create` sends to the server. Local
    files are listed by absolute path (Ollama sends their digests)."""
    req: dict[str, Any] = {}
    params: dict[str, Any] = {}
    model_paths: list[str] = []
    draft_paths: list[str] = []
    for name, args in commands:
        if name == "model":
            path = _expand_path(args, str(relative_dir))
            if not os.path.exists(path):
                req["from"] = args  # a model name, pulled from a registry
                continue
            if any(os.path.samefile(path, d) for d in draft_paths):
                raise CreateError(f"DRAFT must not reference the same local path as FROM: {path}")
            model_paths.append(path)
            req.setdefault("files", []).append(path)
        elif name == "draft":
            path = _expand_path(args, str(relative_dir))
            if not os.path.exists(path):
                raise CreateError(f"stat {path}: no such file or directory")
            if any(os.path.samefile(path, m) for m in model_paths):
                raise CreateError(f"DRAFT must not reference the same local path as FROM: {path}")
            draft_paths.append(path)
            req.setdefault("draft_files", []).append(path)
        elif name == "adapter":
            path = _expand_path(args, str(relative_dir))
            if not os.path.exists(path):
                raise CreateError(f"stat {path}: no such file or directory")
            req["adapters"] = [path]
        elif name in ("template", "system", "renderer", "parser"):
            req[name] = args
        elif name == "license":
            req.setdefault("license", []).append(args)
        elif name == "requires":
            v = args if args.startswith("v") else "v" + args
            if not _SEMVER.fullmatch(v):
                raise CreateError("requires must be a valid semver (e.g. 0.14.0)")
            req["requires"] = v[1:]
        elif name == "message":
            role, _, content = args.partition(": ")
            req.setdefault("messages", []).append({"role": role, "content": content})
        elif name in DEPRECATED_PARAMETERS:
            req.setdefault("warnings", []).append(f"parameter {name} is deprecated")
        else:
            value = format_param(name, args)
            if isinstance(value, list):
                params[name] = params.get(name, []) + value
            else:
                params[name] = value
    if params:
        req["parameters"] = params
    return req


# ---------------------------------------------------------------- Go templates

_ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.DOTALL)


def render_go_template(template: str, messages: list[dict[str, str]]) -> str:
    """Renders a template written with text, {{ .Role }}, {{ .Content }} and
    {{ range .Messages }}...{{ end }} (with {{- -}} trimming); anything else raises."""
    parts: list[str | tuple[str]] = []
    pos = 0
    for m in _ACTION.finditer(template):
        text = template[pos:m.start()]
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        if parts and isinstance(parts[-1], tuple) and parts[-1][0].endswith("-"):
            text = text.lstrip(" \t\r\n")
        parts.append(text)
        parts.append((m.group(2) + ("-" if m.group(3) else ""),))
        pos = m.end()
    tail = template[pos:]
    if parts and isinstance(parts[-1], tuple) and parts[-1][0].endswith("-"):
        tail = tail.lstrip(" \t\r\n")
    parts.append(tail)

    out: list[str] = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if isinstance(p, str):
            out.append(p)
        elif p[0].rstrip("-") == "range .Messages":
            end = next(j for j in range(i + 1, len(parts)) if parts[j] == ("end",) or parts[j] == ("end-",))
            body = parts[i + 1:end]
            for msg in messages:
                for q in body:
                    if isinstance(q, str):
                        out.append(q)
                    elif q[0].rstrip("-") in (".Role", ".Content"):
                        out.append(msg[q[0].rstrip("-")[1:].lower()])
                    else:
                        raise ValueError(f"unsupported action {{{{ {q[0]} }}}} inside range")
            i = end
        else:
            raise ValueError(f"unsupported action {{{{ {p[0]} }}}}")
        i += 1
    return "".join(out)
