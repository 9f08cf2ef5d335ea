"""OpenAI's Responses API on the chat-completions path: `POST /v1/responses`, stateless.

A Responses body is checked here (its own field names in every 400), then
translated into the chat-completions request it stands for: `instructions` a
system turn, input messages turns, `function_call` items an assistant turn's
tool calls, `function_call_output` items tool turns, function `tools`,
`tool_choice`, `max_output_tokens` max_tokens, `text.format` (json_schema,
json_object) response_format, so the grammar path, the tool formats,
sampling, speculation, context drafts, timings, metrics and limits are the
chat path's own. `namespace` tools are flattened into their functions (calls
of them answered with `namespace`); hosted tools (web search, file search,
computer use...) are left out of the prompt and named in a response header.
Nothing is stored: `previous_response_id`, `conversation` and `background`
are a 400 saying so. The answer goes back as a response object with message
and function_call output items, or as the typed events of a stream
(response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta / done,
response.function_call_arguments.delta / done, response.content_part.done,
response.output_item.done, response.completed or response.incomplete).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..sampling import check_param
from . import answers, schemas, tools
from .scheduler import Finished
from .steering import ToolPlan

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")  # what a message's content may hold here
MEDIA_PARTS = ("input_image", "input_file", "input_audio", "image_url", "file")
IGNORED_ITEMS = ("reasoning",)  # an earlier turn's reasoning: never shown to the model again
NOT_STORED = "this server is stateless and stores nothing: send the whole conversation in 'input'"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str = ""
    refusal: str | None = None

    def value(self) -> str:
        return self.refusal if self.type == "refusal" and self.refusal is not None else self.text


def _check_parts(v: Any) -> Any:
    if not isinstance(v, list):
        return v
    for i, part in enumerate(v):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind in TEXT_PARTS:
            continue
        if kind in MEDIA_PARTS:
            raise PydanticCustomError("text_only", "part {i}: '{kind}' parts are not supported: this model takes text "
                                                   "only", {"i": i, "kind": kind})
        raise PydanticCustomError("part_type", "part {i}: '{kind}' parts are not supported (text parts only)",
                                  {"i": i, "kind": kind})
    return v


def _as_parts(v: Any) -> Any:
    """Content given as a string: one text part (so that errors name a part, not a branch of a union)."""
    return [{"type": "input_text", "text": v}] if isinstance(v, str) else v


def _chat_parts(content: list[TextPart]) -> list[dict[str, str]]:
    return [{"type": "text", "text": p.value()} for p in content]


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: list[TextPart]  # a string: one text part

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        return _check_parts(_as_parts(v))


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str = Field(..., min_length=1)
    arguments: str = "{}"
    namespace: str | None = None  # a namespace tool's function: the conversation names the function


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: str
    output: list[TextPart]  # a string: one text part

    @field_validator("output", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        return _check_parts(_as_parts(v))


class IgnoredItem(_Lenient):
    type: Literal["reasoning"]


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | IgnoredItem, Field(discriminator="type")]
ITEM_KINDS = ("message", "function_call", "function_call_output", *IGNORED_ITEMS)


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: str = Field(..., min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(_Lenient):
    """Function tools grouped under a name (the openai SDK's NamespaceTool; Codex sends its multi-agent tools so):
    flattened into its functions, and calls of them answered with `namespace` set."""

    type: Literal["namespace"]
    name: str = Field(..., min_length=1)
    description: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)

    @field_validator("tools", mode="before")
    @classmethod
    def _functions_only(cls, v: Any) -> Any:
        return _check_tool_kinds(v, allowed=("function",))


class HostedTool(_Lenient):
    """A tool OpenAI runs itself (web search, file search, code interpreter, MCP, ...): left out of the prompt."""

    type: str


# OpenAI's hosted tools (and built-ins whose calls are items of their own, as local_shell's): not in the prompt,
# listed in the x-pydflash2-ignored-tools header and the access log; dated variants (web_search_preview_2025_03_11) too
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
                "computer_use", "computer", "image_generation", "local_shell", "shell", "apply_patch", "mcp",
                "tool_search")


def is_hosted(kind: str) -> bool:
    return kind in HOSTED_TOOLS or kind.split("_20")[0] in HOSTED_TOOLS


def _tool_kind(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    if not isinstance(kind, str):
        return None
    return "hosted" if is_hosted(kind) else kind


def _check_tool_kinds(v: Any, allowed: tuple[str, ...]) -> Any:
    if isinstance(v, list):
        for i, t in enumerate(v):
            kind = t.get("type") if isinstance(t, dict) else None
            if isinstance(kind, str) and _tool_kind(t) not in allowed:
                raise PydanticCustomError("built_in_tool", "tool {i}: '{kind}' tools are not served: only function "
                                                           "tools, namespaces of them and hosted tools (left out)",
                                          {"i": i, "kind": kind})
    return v


Tool = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[NamespaceTool, Tag("namespace")]
                 | Annotated[HostedTool, Tag("hosted")], Discriminator(_tool_kind)]


class NamedFunction(_Lenient):
    type: Literal["function"]
    name: str


class TextFormat(_Lenient):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextOptions(_Lenient):
    format: TextFormat | None = None


class ResponsesRequest(_Lenient):
    model: str | None = None
    input: list[Item] = Field(..., min_length=1)  # a string: one user message
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextOptions | None = None
    stream: bool = False
    store: bool | None = None  # accepted, but nothing is ever stored
    metadata: dict[str, str] | None = None
    # not served: a 400 saying so
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_served(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if v.get("previous_response_id") is not None:
                raise PydanticCustomError("not_served", "previous_response_id: not supported: " + NOT_STORED)
            if v.get("conversation") is not None:
                raise PydanticCustomError("not_served", "conversation: not supported: " + NOT_STORED)
            if v.get("background"):
                raise PydanticCustomError("not_served", "background: not supported: responses are answered while "
                                                        "the request waits (or streamed)")
        return v

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, v: Any) -> Any:
        """Each item's kind, before the union sees it: one not served is a 400 naming it."""
        if isinstance(v, str):
            return [{"type": "message", "role": "user", "content": v}]
        if not isinstance(v, list):
            return v
        out = []
        for i, item in enumerate(v):
            if isinstance(item, dict):
                kind = item.get("type", "message" if "role" in item else None)
                if isinstance(kind, str) and kind not in ITEM_KINDS:
                    raise PydanticCustomError("item_type", "item {i}: '{kind}' items are not served (messages, "
                                                           "function_call and function_call_output only)",
                                              {"i": i, "kind": kind})
                if "type" not in item and "role" in item:
                    item = {**item, "type": "message"}
            out.append(item)
        return out

    @field_validator("tools", mode="before")
    @classmethod
    def _served_tools_only(cls, v: Any) -> Any:
        return _check_tool_kinds(v, allowed=("function", "namespace", "hosted"))

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _choice_kind(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("type"), str) and v["type"] != "function":
            if is_hosted(v["type"]):
                raise PydanticCustomError("hosted_tool", "'{kind}' forces a hosted tool, which this server does not "
                                                         "run (hosted tools are left out of the prompt)",
                                          {"kind": v["type"]})
            raise PydanticCustomError("built_in_tool", "'{kind}': only 'none', 'auto', 'required' or a function "
                                                       "({{\"type\": \"function\", \"name\": ...}})",
                                      {"kind": v["type"]})
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_names_a_tool(cls, choice: Any, info: ValidationInfo) -> Any:
        offered = _functions(info.data.get("tools") or [])
        if isinstance(choice, NamedFunction) and not any(t.name == choice.name for t, _ in offered):
            raise PydanticCustomError("tool_choice", "no function named '{name}' in 'tools'", {"name": choice.name})
        return choice

    @field_validator("max_output_tokens", "temperature", "top_p")
    @classmethod
    def _in_range(cls, v: Any, info: ValidationInfo) -> Any:
        name = "max_tokens" if info.field_name == "max_output_tokens" else info.field_name
        return v if v is None else check_param(name, v, label=info.field_name)

    @field_validator("text")
    @classmethod
    def _schema(cls, v: TextOptions | None) -> TextOptions | None:
        if v is not None and v.format is not None and v.format.type == "json_schema" and v.format.schema_ is None:
            raise PydanticCustomError("json_schema", "format: type 'json_schema' needs a 'schema'")
        return v

    def chat_messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        for item in self.input:
            if isinstance(item, MessageItem):
                out.append({"role": item.role, "content": _chat_parts(item.content)})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                last = out[-1] if out else None
                # calls right after an assistant turn (or after each other) belong to that turn
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                output = schemas.PART_SEPARATOR.join(p.value() for p in item.output)
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        return out

    def chat_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": self.chat_messages(), "stream": self.stream,
                                "parallel_tool_calls": self.parallel_tool_calls}
        functions = _functions(self.tools or [])
        if functions:
            body["tools"] = [{"type": "function", "function": {
                "name": t.name, **({"description": t.description} if t.description is not None else {}),
                **({"parameters": t.parameters} if t.parameters is not None else {})}} for t, _ in functions]
        choice = self.tool_choice
        if choice is not None:
            body["tool_choice"] = ({"type": "function", "function": {"name": choice.name}}
                                   if isinstance(choice, NamedFunction) else choice)
        for name, chat_name in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                                ("top_p", "top_p")):
            if getattr(self, name) is not None:
                body[chat_name] = getattr(self, name)
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_,
                **({"strict": fmt.strict} if fmt.strict is not None else {})}}
        elif fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        return body


    def ignored_tools(self) -> list[str]:
        """The hosted tools offered, by type: left out of the prompt."""
        return [t.type for t in self.tools or [] if isinstance(t, HostedTool)]

    def namespaces(self) -> dict[str, str]:
        """Each namespaced function's namespace, by the function's name."""
        return {t.name: ns for t, ns in _functions(self.tools or []) if ns is not None}


def _functions(offered: list[Any]) -> list[tuple[FunctionTool, str | None]]:
    """The function tools offered, namespaces flattened, each with its namespace (None: none)."""
    out: list[tuple[FunctionTool, str | None]] = []
    for t in offered:
        if isinstance(t, FunctionTool):
            out.append((t, None))
        elif isinstance(t, NamespaceTool):
            out += [(f, t.name) for f in t.tools]
    return out


# chat-completions field names in errors the chat path raises, as this API names them
PARAMS = {"max_tokens": "max_output_tokens", "prompt": "input", "messages": "input", "response_format": "text.format",
          "tools": "tools", "tool_choice": "tool_choice"}


# ---------------------------------------------------------------- the answer


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage(done: Finished) -> dict[str, Any]:
    cached = int(done.timings.get("cache_n", 0))
    return {"input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": done.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [_text_part(text)]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str,
               namespace: str | None = None) -> dict[str, Any]:
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
    return item if namespace is None else {**item, "namespace": namespace}


def _item_status(status: str) -> str:
    """A message item's status in a response of `status` (a failed response's text is cut off)."""
    return "incomplete" if status == "failed" else status


def context_error(done: Finished | None) -> dict[str, str] | None:
    """A failed response's error: the answer reached the end of the context (OpenAI's code for a conversation
    past the model's context window, which Codex reads as such and does not resend, where it resends an
    incomplete response as a broken stream)."""
    if done is None:
        return None
    return {"code": "context_length_exceeded",
            "message": f"the answer reached the end of the context ({done.prompt_tokens} prompt tokens and "
                       f"{done.completion_tokens} generated fill the {done.prompt_tokens + done.completion_tokens} "
                       "tokens of a request's context): start the conversation again shorter, or serve with a "
                       "larger --n-ctx"}


@dataclass
class ResponseAnswer:
    """One request's answer as a Responses API response, whole or streamed."""

    rid: str
    model: str
    body: ResponsesRequest
    plan: ToolPlan | None
    created: int = field(default_factory=schemas.now)

    def response(self, status: str, output: list[dict[str, Any]], done: Finished | None = None) -> dict[str, Any]:
        b = self.body
        fmt = b.text.format if b.text is not None and b.text.format is not None else None
        choice = b.tool_choice
        out: dict[str, Any] = {
            "id": self.rid, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "error": context_error(done) if status == "failed" else None,
            "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
            "instructions": b.instructions, "metadata": b.metadata or {},
            "parallel_tool_calls": b.parallel_tool_calls,
            "temperature": b.temperature, "top_p": b.top_p, "max_output_tokens": b.max_output_tokens,
            "tool_choice": (choice.model_dump() if isinstance(choice, BaseModel) else (choice or "auto")),
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or []],
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "previous_response_id": None, "store": False, "truncation": "disabled", "reasoning": None,
            "usage": usage(done) if done is not None else None,
        }
        if done is not None:
            out["timings"] = done.timings
        return out

    @staticmethod
    def _status(done: Finished) -> str:
        if done.finish_reason == "length":
            return "failed" if done.context_full else "incomplete"
        return "completed"

    def whole(self, done: Finished) -> dict[str, Any]:
        text, calls = answers.split(self.plan, done.text)
        output: list[dict[str, Any]] = []
        if text or not calls:
            output.append(_message_item(new_id("msg"), text, _item_status(self._status(done))))
        spaces = self.body.namespaces()
        output += [_call_item(new_id("fc"), tools.new_call_id(), c.name, c.arguments, "completed", spaces.get(c.name))
                   for c in calls]
        return self.response(self._status(done), output, done)

    async def stream(self, events: AsyncIterator[answers.Event]) -> AsyncIterator[dict[str, str]]:
        seq = 0
        output: list[dict[str, Any]] = []  # the items so far, each as it stands
        open_item: dict[str, Any] | None = None

        def ev(kind: str, **fields: Any) -> dict[str, str]:
            nonlocal seq
            seq += 1
            return {"event": kind, "data": json.dumps({"type": kind, "sequence_number": seq - 1, **fields},
                                                      separators=(",", ":"))}

        def close(status: str = "completed") -> list[dict[str, str]]:
            nonlocal open_item
            item, open_item = open_item, None
            if item is None:
                return []
            n = len(output) - 1
            item["status"] = status
            if item["type"] == "message":
                part = item["content"][0]
                return [ev("response.output_text.done", item_id=item["id"], output_index=n, content_index=0,
                           text=part["text"], logprobs=[]),
                        ev("response.content_part.done", item_id=item["id"], output_index=n, content_index=0,
                           part=part),
                        ev("response.output_item.done", output_index=n, item=item)]
            return [ev("response.function_call_arguments.done", item_id=item["id"], output_index=n,
                       arguments=item["arguments"]),
                    ev("response.output_item.done", output_index=n, item=item)]

        def begin(item: dict[str, Any]) -> list[dict[str, str]]:
            nonlocal open_item
            out = close()
            output.append(item)
            open_item = item
            n = len(output) - 1
            out.append(ev("response.output_item.added", output_index=n, item=dict(item, content=[])
                          if item["type"] == "message" else dict(item)))
            if item["type"] == "message":
                out.append(ev("response.content_part.added", item_id=item["id"], output_index=n, content_index=0,
                              part=_text_part("")))
            return out

        def text_delta(text: str) -> dict[str, str]:
            assert open_item is not None
            open_item["content"][0]["text"] += text
            return ev("response.output_text.delta", item_id=open_item["id"], output_index=len(output) - 1,
                      content_index=0, delta=text, logprobs=[])

        def args_delta(text: str) -> dict[str, str]:
            assert open_item is not None
            open_item["arguments"] += text
            return ev("response.function_call_arguments.delta", item_id=open_item["id"],
                      output_index=len(output) - 1, delta=text)

        yield ev("response.created", response=self.response("in_progress", []))
        yield ev("response.in_progress", response=self.response("in_progress", []))
        spaces = self.body.namespaces()
        async for x in answers.blocks(events, self.plan):
            out: list[dict[str, str]] = []
            if isinstance(x, Finished):
                if x.finish_reason == "error":
                    kind = {400: "invalid_request_error", 503: "server_busy"}.get(x.status, "server_error")
                    yield ev("error", code=kind, message=x.error or "generation failed", param=None)
                    failed = self.response("failed", output)
                    failed["error"] = {"code": "server_error", "message": x.error or "generation failed"}
                    yield ev("response.failed", response=failed)
                    return
                status = self._status(x)
                out += close(_item_status(status) if open_item is not None and open_item["type"] == "message"
                             else "completed")
                out.append(ev(f"response.{status}", response=self.response(status, output, x)))
            elif isinstance(x, answers.BlockStart):
                out += begin(_message_item(new_id("msg"), "", "in_progress") if x.name is None else
                             _call_item(new_id("fc"), tools.new_call_id(), x.name, "", "in_progress",
                                        spaces.get(x.name)))
            elif isinstance(x, str):
                out.append(text_delta(x))
            else:
                out.append(args_delta(x.text))
            for e in out:
                yield e
