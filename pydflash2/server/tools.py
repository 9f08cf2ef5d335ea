"""Tool calls in a model's output: the formats chat templates teach, found from
the template's source as llama.cpp's common/chat.cpp finds them, parsed from
text (streamed or whole), and the GBNF that forces a call (tool_choice
"required" or a named function).

Formats (llama.cpp's names in brackets):
- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one
  block per call (Hermes 2 Pro, Qwen2.5, Qwen3, SmolLM3) [Hermes 2 Pro];
- llama3: the whole answer is `{"name": ..., "parameters": {...}}`, perhaps
  after `<|python_tag|>` (Llama 3.1-3.3) [Llama 3.x];
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral
  Nemo, Small 3.0/3.1) [Mistral Nemo].
Text that does not parse as a call of a known tool stays content, as llama.cpp
leaves it.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from . import grammars


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it

    def openai(self, call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    start: str  # what opens the call section ("" : the answer itself is the call)
    arguments_key: str  # "arguments" or "parameters"

    def parse_section(self, section: str, tools: set[str]) -> list[ToolCall] | None:
        """The calls in a section that began with `start`; None when it is not one."""
        try:
            if self.name == "hermes":
                end = section.find("</tool_call>")
                if end < 0 or section[end + len("</tool_call>"):].strip():
                    return None
                items = [json.loads(section[len(self.start):end])]
            elif self.name == "mistral":
                items = json.loads(section[len(self.start):])
            else:
                items = [json.loads(section.removeprefix("<|python_tag|>"))]
        except ValueError:
            return None
        if not isinstance(items, list) or not items:
            return None
        calls = []
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in tools:
                return None
            args = item.get(self.arguments_key, item.get("arguments", {}))
            if isinstance(args, str):  # some models send a JSON string
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            if not isinstance(args, dict):
                return None
            calls.append(ToolCall(item["name"], json.dumps(args, ensure_ascii=False, separators=(",", ":"))))
        return calls

    def section_end(self, text: str) -> int | None:
        """Where a section that begins `text` ends (the index after it), None while open."""
        if self.name == "hermes":
            end = text.find("</tool_call>")
            return None if end < 0 else end + len("</tool_call>")
        return None  # mistral and llama3: the call runs to the end of the answer

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """GBNF whose sentences are calls of these tools in this format (llama-cpp-python's
        JSON-schema converter writes the JSON; this adds what wraps it). ValueError for
        parameters the converter cannot express."""
        call = {"anyOf": [{
            "type": "object",
            "properties": {"name": {"const": t["name"]}, self.arguments_key: t.get("parameters") or {"type": "object"}},
            "required": ["name", self.arguments_key],
        } for t in tools]}
        for t in tools:
            grammars.check_schema(t.get("parameters"), f"/{t['name']}")
        conv = SchemaConverter(prop_order={"name": 0, self.arguments_key: 1}, allow_fetch=False, dotall=False,
                               raw_pattern=False)
        rule = conv.visit(conv.resolve_refs(call, "tools"), "tool-call")
        if self.name == "hermes":
            one = f'"<tool_call>\\n" {rule} "\\n</tool_call>"'
            root = f'{one} ("\\n" {one})*' if parallel else one
        elif self.name == "mistral":
            root = f'"[TOOL_CALLS][" {rule} ("," space {rule})* "]"' if parallel else f'"[TOOL_CALLS][" {rule} "]"'
        else:
            root = rule
        return conv.format_grammar() + f"\nroot ::= {root}\n"


HERMES = ToolCallFormat("hermes", "<tool_call>", "arguments")
LLAMA3 = ToolCallFormat("llama3", "", "parameters")
MISTRAL = ToolCallFormat("mistral", "[TOOL_CALLS]", "arguments")


def detect_format(template_source: str) -> ToolCallFormat | None:
    """The call format a template teaches; None for one this module does not parse."""
    src = template_source
    if "<tool_call>" in src:
        # Qwen3-Coder / Qwen3.5 / Nemotron write XML parameters inside the block: not parsed here
        return None if "<function=" in src or "<parameter=" in src else HERMES
    if "[TOOL_CALLS]" in src:
        return None if "[ARGS]" in src else MISTRAL  # [ARGS]: Magistral / Small 3.2, name outside the JSON
    if "<|python_tag|>" in src or ("<|start_header_id|>" in src and '"parameters": ' in src):
        return LLAMA3
    return None


class ToolCallStream:
    """Splits an answer, piece by piece, into content and tool calls. Content that
    may still turn out to be a call is held back until it is known. push() and
    finish() return what can be released: str (content) or ToolCall items."""

    def __init__(self, fmt: ToolCallFormat, tools: set[str], parallel: bool = True) -> None:
        self.fmt, self.tools, self.parallel = fmt, tools, parallel
        self._buf = ""
        self._n_calls = 0
        self._seen_content = False

    def push(self, piece: str) -> list[str | ToolCall]:
        self._buf += piece
        return self._drain(final=False)

    def finish(self) -> list[str | ToolCall]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        fmt = self.fmt
        while self._buf:
            if not fmt.start:  # llama3: the whole answer is a call, or none of it is
                head = self._buf.lstrip()
                if self._seen_content or not (head.startswith("{") or head.startswith("<|python_tag|>")
                                              or "{".startswith(head) or "<|python_tag|>".startswith(head)):
                    self._seen_content = True
                    out.append(self._buf)
                    self._buf = ""
                elif final:
                    calls = fmt.parse_section(head, self.tools)
                    out.extend(calls if calls else [self._buf])
                    self._buf = ""
                break
            if self._n_calls:  # whitespace after a call, before the end or the next call, is markup
                rest = self._buf.lstrip()
                if not rest:
                    if final:
                        self._buf = ""
                    break
                if rest.startswith(fmt.start):
                    self._buf = rest
                elif fmt.start.startswith(rest) and not final:
                    break
            at = self._buf.find(fmt.start)
            if at < 0:
                keep = 0 if final else _partial_suffix(self._buf, fmt.start)
                if len(self._buf) > keep:
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                break
            if at > 0:
                out.append(self._buf[:at])
                self._buf = self._buf[at:]
            end = fmt.section_end(self._buf)
            if end is None and not final:
                break
            section = self._buf if end is None else self._buf[:end]
            calls = fmt.parse_section(section, self.tools) if self.parallel or self._n_calls == 0 else None
            if calls:
                calls = calls if self.parallel else calls[:1]
                self._n_calls += len(calls)
                out.extend(calls)
                # whitespace between blocks belongs to the calls' markup
                self._buf = self._buf[len(section):].lstrip() if end is not None else ""
            else:
                out.append(section)
                self._buf = self._buf[len(section):]
        return _merge_text(out)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that begins marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _merge_text(items: list[str | ToolCall]) -> list[str | ToolCall]:
    out: list[str | ToolCall] = []
    for x in items:
        if isinstance(x, str):
            if not x:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += x
                continue
        out.append(x)
    return out


def split_answer(fmt: ToolCallFormat, tools: set[str], text: str, parallel: bool = True) -> tuple[str, list[ToolCall]]:
    """A whole answer's content and calls (the stream's rule, applied at once)."""
    s = ToolCallStream(fmt, tools, parallel)
    items = s.push(text) + s.finish()
    content = "".join(x for x in items if isinstance(x, str))
    calls = [x for x in items if isinstance(x, ToolCall)]
    return (content.strip() if calls else content), calls
