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
- generic: for templates without a tool format of their own (llama.cpp's
  generic format): the tools are described in the system turn and the whole
  answer is constrained by grammar to JSON, `{"tool_calls": [{"name": ...,
  "arguments": {...}}, ...]}` (`{"tool_call": {...}}` without parallel calls)
  or `{"response": "..."}`, the reply to the user (with tool_choice auto the
  grammar leaves the arguments any object).
Text that does not parse as a call of a known tool stays content, as llama.cpp
leaves it.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import json_schema


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
        return _calls(items, tools, self._arguments)

    def _arguments(self, item: dict[str, Any]) -> str | None:
        """A call's arguments as compact JSON text; None where they are not an object."""
        args = item.get(self.arguments_key, item.get("arguments", {}))
        if isinstance(args, str):  # some models send a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        return json.dumps(args, ensure_ascii=False, separators=(",", ":")) if isinstance(args, dict) else None

    def section_end(self, text: str) -> int | None:
        """Where a section that begins `text` ends (the index after it), None while open."""
        if self.name == "hermes":
            end = text.find("</tool_call>")
            return None if end < 0 else end + len("</tool_call>")
        return None  # mistral and llama3: the call runs to the end of the answer

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """GBNF whose sentences are calls of these tools in this format (llama-cpp-python's
        JSON-schema converter, pydflash2.json_schema, writes the JSON; this adds what wraps it). ValueError for
        parameters the converter cannot express."""
        call = {"anyOf": [{
            "type": "object",
            "properties": {"name": {"const": t["name"]}, self.arguments_key: arguments_schema(t)},
            "required": ["name", self.arguments_key],
        } for t in tools]}
        for t in tools:
            json_schema.check_schema(t.get("parameters"), f"/{t['name']}")
        conv = json_schema.converter({"name": 0, self.arguments_key: 1})
        rule = conv.visit(conv.resolve_refs(call, "tools"), "tool-call")
        if self.name == "hermes":
            one = f'"<tool_call>\\n" {rule} "\\n</tool_call>"'
            root = f'{one} ("\\n" {one})*' if parallel else one
        elif self.name == "mistral":
            root = f'"[TOOL_CALLS][" {rule} ("," space {rule})* "]"' if parallel else f'"[TOOL_CALLS][" {rule} "]"'
        else:
            root = rule
        return conv.format_grammar() + f"\nroot ::= {root}\n"


def arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The schema of a call's arguments: the tool's parameters, an object even where they name no
    type (annotations only would otherwise allow any JSON value)."""
    params = tool.get("parameters")
    return {"type": "object", **params} if isinstance(params, dict) else {"type": "object"}


HERMES = ToolCallFormat("hermes", "<tool_call>", "arguments")
GENERIC = ToolCallFormat("generic", "", "arguments")
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


@dataclass(frozen=True)
class CallStart:
    """A streamed call's name is known; its arguments follow as ArgsPart items."""

    name: str


@dataclass(frozen=True)
class ArgsPart:
    """A piece of the open call's arguments, as the model wrote them: the pieces concatenate to its arguments."""

    text: str


Item = str | ToolCall | CallStart | ArgsPart

# the head of a Hermes call, name first (as the templates teach it and forced calls' grammars write it):
# from here on the call is streamed, its arguments piece by piece
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')
_JSON = json.JSONDecoder(strict=False)  # calls written without a grammar (tool_choice auto) may hold control chars


# ---------------------------------------------------------------- the generic format

GENERIC_INSTRUCTION = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
                       "reply to the user's request")


def _call_schema(t: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object",
                              "properties": {"name": {"const": t["name"]},
                                             "arguments": arguments_schema(t)},
                              "required": ["name", "arguments"]}
    if t.get("description"):
        schema["description"] = t["description"]
    return schema


def generic_schema(tools: list[dict[str, Any]], parallel: bool, required: bool) -> dict[str, Any]:
    """The JSON schema of an answer in the generic format (llama.cpp's): calls of these tools, or
    (unless a call is required) a response to the user."""
    calls = [_call_schema(t) for t in tools]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        answer = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                  "required": ["tool_calls"]}
    else:
        answer = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
    if required:
        return answer
    return {"anyOf": [answer, {"type": "object", "properties": {"response": {"type": "string"}},
                               "required": ["response"]}]}


def generic_grammar(tools: list[dict[str, Any]], parallel: bool, required: bool) -> str:
    """GBNF of generic_schema (pydflash2.json_schema's converter). ValueError for parameters it cannot express.
    Unless a call is required, a call's arguments are any JSON object, read as the model writes them (as auto
    calls in the other formats are, which no grammar constrains): the grammar holds the answer's shape and the
    tools' names, and the tools' schemas cost nothing (agents offer dozens, some the converter cannot take or
    writes megabytes of grammar for, as Claude Code's maxLength 524288)."""
    if not required:
        tools = [{**t, "parameters": {"type": "object"}} for t in tools]
    for t in tools:
        json_schema.check_schema(t.get("parameters"), f"/{t['name']}")
    conv = json_schema.converter({"tool_calls": 0, "tool_call": 0, "response": 0, "name": 1, "arguments": 2})
    conv.visit(conv.resolve_refs(generic_schema(tools, parallel, required), "tools"), "")
    return conv.format_grammar()


# tool_choice "none" after calls (the history holds them): the answer is text, and the system turn says so
PLAIN_INSTRUCTION = "No tools can be called now: reply to the user in plain text."


def generic_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     calls: bool = True) -> list[dict[str, Any]]:
    """A conversation for a template that knows nothing of tools, as llama.cpp's generic format
    (and minja's polyfills) shape it: the tools and the answer's form described in the system turn,
    earlier calls as the JSON the model wrote, tool results as JSON in a user turn. calls False
    (tool_choice "none"): no tools described, and the system turn asks for plain text."""
    described = ("You can call any of the following tools to satisfy the user's requests: "
                 + json.dumps(tools, ensure_ascii=False, indent=2) + "\n\n" + GENERIC_INSTRUCTION
                 if calls else PLAIN_INSTRUCTION)
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _as_object(c["function"].get("arguments")),
                      **({"id": c["id"]} if c.get("id") else {})} for c in m.pop("tool_calls")]
            m["content"] = json.dumps({"tool_calls": calls}, ensure_ascii=False, indent=2)
        elif m["role"] == "tool":
            response = {"tool": m.pop("name", None) or "", "content": m.get("content", "")}
            if m.get("tool_call_id"):
                response["tool_call_id"] = m.pop("tool_call_id")
            m = {"role": "user", "content": json.dumps({"tool_response": response}, ensure_ascii=False, indent=2)}
        out.append(m)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}"}
    else:
        out.insert(0, {"role": "system", "content": described})
    return out


_RESPONSE_HEAD = re.compile(r'\s*\{\s*"response"\s*:\s*"')
# the heads of a generic answer, whitespace left out: a response, calls (parallel), a call; between calls
_GENERIC_HEADS = ('{"response":"', '{"tool_calls":[{"name":"', '{"tool_call":{"name":"')
_GENERIC_NEXT = '},{"name":"'
_NAME = r'\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"'
_GENERIC_CALL = re.compile(r'\s*\{\s*"(?P<key>tool_calls?)"\s*:\s*\[?\s*' + _NAME)
_GENERIC_NEXT_CALL = re.compile(r'\s*\}\s*,\s*' + _NAME)
_GENERIC_ARGS = re.compile(r'\s*,\s*"arguments"\s*:\s*(?=\S)')
_WHITESPACE = re.compile(r"\s+")


def _compact(text: str) -> str:
    return _WHITESPACE.sub("", text)


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_PLAIN = re.compile(r'[^"\\]+')


def _string_prefix(body: str, final: bool) -> tuple[str, int, bool]:
    """The text of the JSON string whose body (after its opening quote) begins `body`, as far as it can be
    decoded: (text, characters used, whether the closing quote came). A half-written escape waits for the
    rest (a high surrogate's escape for its low half, which may come in another piece); cut off there
    (final), it is dropped. A lone surrogate becomes U+FFFD (text must be valid Unicode)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c != "\\":
            m = _PLAIN.match(body, i)
            assert m is not None
            out.append(m.group())
            i = m.end()
            continue
        if i + 1 >= n:
            break
        e = body[i + 1]
        if e != "u":
            out.append(_ESCAPES.get(e, e))  # (the grammar allows only JSON's escapes)
            i += 2
            continue
        code = _hex4(body, i + 2)
        if code is None:
            if i + 6 > n:
                break
            out.append(body[i:i + 6])  # not an escape (no grammar): as written
            i += 6
            continue
        if 0xD800 <= code < 0xDC00:  # a high surrogate: its low half's escape follows
            low = _hex4(body, i + 8) if body.startswith("\\u", i + 6) else None
            if low is None and not final and "\\u".startswith(body[i + 6:i + 8]) and i + 12 > n:
                break
            if low is not None and 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
                continue
            code = 0xFFFD
        elif 0xDC00 <= code < 0xE000:
            code = 0xFFFD
        out.append(chr(code))
        i += 6
    return "".join(out), i, False


def _hex4(text: str, at: int) -> int | None:
    digits = text[at:at + 4]
    if len(digits) < 4 or any(ch not in "0123456789abcdefABCDEF" for ch in digits):
        return None
    return int(digits, 16)


def _cut_response(text: str) -> str:
    """The text of a generic answer's response cut off by max_tokens; "" for anything else."""
    head = _RESPONSE_HEAD.match(text)
    if not head:
        return ""
    body = text[head.end():]
    for cut in range(len(body), max(-1, len(body) - 7), -1):  # drop a half-written escape (\u12...)
        try:
            return str(json.loads(f'"{body[:cut]}"', strict=False))
        except ValueError:
            continue
    return ""


def partial_object(text: str) -> dict[str, Any]:
    """The JSON object `text` holds, or, cut off (max_tokens), what it holds so far: closed where it ends
    (closing_suffix), else where it ends less a half-written escape, literal or key; {} when there is no
    object."""
    for trim in range(min(8, len(text)) + 1):
        base = text[:len(text) - trim]
        suffix = closing_suffix(base)
        if suffix is not None:
            value = json.loads(base + suffix, strict=False)
            return value if isinstance(value, dict) else {}
    return {}


def closing_suffix(text: str) -> str | None:
    """What closes JSON text cut off where it ends: "" when it is whole, else its open string (and, for a key,
    a null value) and its open arrays and objects, so that text + suffix parses; None where no suffix can
    (a trailing comma, a half-written escape or literal)."""
    open_string, closers = _open_ends(text)
    for suffix in ('"', '": null') if open_string else ("", "null", ": null"):
        try:
            json.loads(text + suffix + closers, strict=False)
        except ValueError:
            continue
        return suffix + closers
    return None


def _open_ends(text: str) -> tuple[bool, str]:
    """Whether JSON text ends inside a string, and what closes the arrays and objects open where it ends."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    return in_string, "".join(reversed(stack))


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def parse_generic(text: str, tools: set[str], parallel: bool) -> tuple[str, list[ToolCall]] | None:
    """A generic-format answer's (content, calls); None when it is not one (the text is then content)."""
    try:
        answer = json.loads(text, strict=False)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    if isinstance(answer.get("response"), str):
        return answer["response"], []
    items = answer.get("tool_calls") if "tool_calls" in answer else [answer.get("tool_call")]

    def arguments(item: dict[str, Any]) -> str:
        args = item.get("arguments", {})
        return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)

    calls = _calls(items, tools, arguments)
    if calls is None:
        return None
    return "", calls if parallel else calls[:1]


def _calls(items: Any, tools: set[str], arguments: Callable[[dict[str, Any]], str | None]) -> list[ToolCall] | None:
    """The calls a parsed answer lists (each {"name": ..., and its arguments}, which `arguments` writes as
    JSON text or refuses with None); None unless every item is a call of one of `tools`."""
    if not isinstance(items, list) or not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in tools:
            return None
        args = arguments(item)
        if args is None:
            return None
        calls.append(ToolCall(item["name"], args))
    return calls


class ToolCallStream:
    """Splits an answer, piece by piece, into content and tool calls. Content that
    may still turn out to be a call is held back until it is known. push() and
    finish() return what can be released: str (content), ToolCall (a whole call),
    or, for Hermes calls that name the tool first and generic-format calls,
    CallStart then ArgsPart pieces as the arguments are generated (the pieces
    concatenate to the arguments). A generic-format response's text is released
    as it is decoded (its JSON string unescaped piece by piece).

    A call's markup never reaches the content: a call cut off by max_tokens ends
    with the arguments written so far (or, cut before its name, is dropped), and
    with parallel_tool_calls off, calls after the first are dropped."""

    def __init__(self, fmt: ToolCallFormat, tools: set[str], parallel: bool = True) -> None:
        self.fmt, self.tools, self.parallel = fmt, tools, parallel
        self._buf = ""
        self._n_calls = 0
        self._seen_content = False
        self._args_sent: int | None = None  # a streamed call is open: its arguments so far are _buf; sent of them
        # the generic format: "head" (not yet known), "response" (its string), "after_call" (a call's arguments
        # ended), "end", "text" (no JSON: content), "whole" (JSON of another shape: read at the end)
        self._g = "head"
        self._single: bool | None = None  # the generic answer's form: {"tool_call": ...} or {"tool_calls": [...]}

    def push(self, piece: str) -> list[Item]:
        self._buf += piece
        return self._drain(final=False)

    def finish(self) -> list[Item]:
        return self._drain(final=True)

    def _arguments(self, final: bool) -> tuple[str, bool]:
        """The open call's next arguments piece, and whether the call has ended (_buf then holds what follows)."""
        region, sent = self._buf, self._args_sent or 0
        marker = "</tool_call>" if self.fmt is HERMES else ""  # generic: the call's object closes after the value
        try:
            _, end = _JSON.raw_decode(region)
        except ValueError:  # incomplete (every character so far is the value's) or broken
            at = region.find(marker) if marker else -1
            if at >= 0:  # broken: the call ends at its closing tag, arguments as written
                self._buf = region[at + len(marker):]
                return region[sent:at], True
            if final:  # cut off: the arguments written so far
                self._buf = ""
                return region[sent:], True
            keep = _partial_suffix(region, marker) if marker else 0
            self._args_sent = max(sent, len(region) - keep)
            return region[sent:self._args_sent], False
        if not marker:
            self._buf = region[end:]
            return region[sent:end], True
        at = region.find(marker, end)
        if at >= 0 or final:  # what follows the value up to the closing tag ("}\n") is markup
            self._buf = region[at + len(marker):] if at >= 0 else ""
            return region[sent:end], True
        self._args_sent = end
        return region[sent:end], False

    def _generic(self, out: list[Item], final: bool) -> bool:
        """One move of a generic-format answer's reading (its state in _g); False: wait for more text."""
        buf, state = self._buf, self._g
        if state == "head":  # which answer this is: wait until the JSON's head says it
            compact = _compact(buf)
            if compact and compact[0] != "{":  # not JSON at all (a model without the grammar): content
                self._g = "text"
                return True
            head = next((h for h in _GENERIC_HEADS if compact.startswith(h)), None)
            if head is None:
                if not final and any(h.startswith(compact) for h in _GENERIC_HEADS):
                    return False
                self._g = "whole"
                return True
            if head == _GENERIC_HEADS[0]:
                m = _RESPONSE_HEAD.match(buf)
                if m is None:
                    self._g = "whole"
                    return True
                self._buf, self._g = buf[m.end():], "response"
                return True
            return self._generic_call(_GENERIC_CALL.match(buf), out, final, first=True)
        if state == "response":  # the response's JSON string, decoded as it comes
            text, used, closed = _string_prefix(buf, final)
            if text:
                out.append(text)
            self._buf = buf[used:]
            if closed or final:
                self._buf, self._g = "", "end"
                return False
            return False
        if state == "after_call":  # the next call, or the end of the answer
            compact = _compact(buf)
            if compact.startswith(_GENERIC_NEXT):
                if not (self.parallel and self._single is False):  # one call only: the rest is dropped
                    self._buf, self._g = "", "end"
                    return False
                return self._generic_call(_GENERIC_NEXT_CALL.match(buf), out, final, first=False)
            if not final and _GENERIC_NEXT.startswith(compact):
                return False
            self._buf, self._g = "", "end"
            return False
        if state == "text":
            out.append(buf)
            self._buf = ""
            return False
        if state == "whole":  # JSON of another shape: read at the end
            if final:
                parsed = parse_generic(buf, self.tools, self.parallel)
                if parsed is None:  # not an answer of this format: a response cut off, or content
                    out.append(_cut_response(buf) if buf.lstrip().startswith("{") else buf)
                else:
                    out.extend([parsed[0], *parsed[1]])
                self._buf = ""
            return False
        self._buf = ""  # "end": what follows the answer's JSON is markup
        return False

    def _generic_call(self, m: re.Match[str] | None, out: list[Item], final: bool, first: bool) -> bool:
        """A generic-format call's head (m: up to its name's string): its CallStart once the arguments begin."""
        if m is None:  # the name not written out yet; cut off there: dropped
            if final:
                self._buf, self._g = "", "end"
            return False
        name = _json_string(m.group("name"))
        if name not in self.tools:  # (the grammar allows only these)
            self._g = "whole" if first else "end"
            return True
        if first:
            self._single = m.group("key") == "tool_call"
        tail = _GENERIC_ARGS.match(self._buf, m.end())
        if tail is None:
            if final:  # cut off with its name complete: a call without arguments
                out.append(ToolCall(name, "{}"))
                self._n_calls += 1
                self._buf, self._g = "", "end"
            return False
        out.append(CallStart(name))
        self._buf, self._g, self._args_sent = self._buf[tail.end():], "after_call", 0
        return True

    def _drain(self, final: bool) -> list[Item]:
        out: list[Item] = []
        fmt = self.fmt
        while self._buf or (final and self._args_sent is not None):
            if self._args_sent is not None:  # a streamed call's arguments
                piece, done = self._arguments(final)
                if piece:
                    out.append(ArgsPart(piece))
                if not done:
                    break
                self._args_sent = None
                self._n_calls += 1
                continue
            if fmt is GENERIC:  # the whole answer is one JSON object: its response or its calls, as they come
                if not self._generic(out, final):
                    break
                continue
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
                elif fmt.start.startswith(rest):  # the next call's opening tag, perhaps cut off
                    if final:
                        self._buf = ""
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
            wanted = self.parallel or self._n_calls == 0
            if fmt is HERMES and wanted:
                head = _HERMES_HEAD.match(self._buf, len(fmt.start))
                if head and _json_string(head.group(1)) in self.tools:
                    out.append(CallStart(_json_string(head.group(1))))
                    self._buf = self._buf[head.end():]
                    self._args_sent = 0
                    continue
            end = fmt.section_end(self._buf)
            if end is None and not final:
                break
            section = self._buf if end is None else self._buf[:end]
            if (end is None and fmt is HERMES) or not wanted:
                # cut off before the call's name was known, or a call after the first with parallel_tool_calls
                # off: markup, dropped (never content)
                self._buf = self._buf[len(section):].lstrip() if end is not None else ""
                continue
            calls = fmt.parse_section(section, self.tools)
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


def _json_string(body: str) -> str:
    """A JSON string's body (between its quotes) as text."""
    try:
        return str(json.loads(f'"{body}"'))
    except ValueError:
        return body


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that begins marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _merge_text(items: list[Item]) -> list[Item]:
    out: list[Item] = []
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
    calls = assemble(items)
    return (content.strip() if calls else content), calls


def assemble(items: list[Item]) -> list[ToolCall]:
    """The calls in a stream's items, streamed ones put together."""
    calls: list[ToolCall] = []
    for x in items:
        if isinstance(x, ToolCall):
            calls.append(x)
        elif isinstance(x, CallStart):
            calls.append(ToolCall(x.name, ""))
        elif isinstance(x, ArgsPart):
            calls[-1] = ToolCall(calls[-1].name, calls[-1].arguments + x.text)
    return calls
