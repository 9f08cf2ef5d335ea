"""Anthropic's Messages API on the chat-completions path: `POST /v1/messages` and
`POST /v1/messages/count_tokens`.

A Messages body is checked here (Anthropic's field names in every 400), then
translated into the chat-completions request it stands for: the system prompt
a system turn, `tool_use` blocks an assistant turn's tool calls, `tool_result`
blocks tool turns, `tools` function tools, `tool_choice` auto / any / tool /
none as auto / required / a named function / none, `stop_sequences` stop. So
the template, the tool formats and their grammars, sampling, speculation,
context drafts, timings, metrics and limits are the chat path's own. The
answer goes back in Anthropic's shapes: a message with text and `tool_use`
blocks, or the event sequence of a stream (message_start, ping,
content_block_start / delta / stop with text_delta and input_json_delta,
message_delta with the stop reason and usage, message_stop); errors as
`{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..sampling import check_param
from . import answers, schemas, tools
from .scheduler import Finished
from .steering import ToolPlan

PREFIX = "/v1/messages"  # the routes whose errors take Anthropic's shape
MAX_STOP_SEQUENCES = schemas.MAX_STOP
# what Anthropic's blocks and the model's text-only input make of them
MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")
IGNORED_BLOCKS = ("thinking", "redacted_thinking")  # an earlier turn's reasoning: never shown to the model again


def is_route(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
            529: "overloaded_error"}.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


# ---------------------------------------------------------------- the request


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, citations, ...: nothing to do here


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: str
    name: str = Field(..., min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str
    content: list[TextBlock] = Field(default_factory=list)  # a string: one text block
    is_error: bool = False

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        return _check_blocks(_as_blocks(v), allowed=("text",))

    def text(self) -> str:
        return schemas.PART_SEPARATOR.join(b.text for b in self.content)


class IgnoredBlock(_Lenient):
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | IgnoredBlock, Field(discriminator="type")]


def _as_blocks(v: Any) -> Any:
    """Content given as a string: one text block (so that errors name a block, not a branch of a union)."""
    return [{"type": "text", "text": v}] if isinstance(v, str) else v


def _check_blocks(v: Any, allowed: tuple[str, ...]) -> Any:
    """A content list's blocks, before their models see them: media is a 400 saying the model takes
    text only, any other unknown kind a 400 naming it (rather than a union's type errors)."""
    if not isinstance(v, list):
        return v
    for i, block in enumerate(v):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str) or kind in allowed:
            if kind == "tool_result" and isinstance(block.get("content"), list):  # its blocks: text only too
                for j, inner in enumerate(block["content"]):
                    inner_kind = inner.get("type") if isinstance(inner, dict) else None
                    if isinstance(inner_kind, str) and inner_kind != "text":
                        raise PydanticCustomError(
                            "text_only", "block {i}: tool_result content block {j}: '{kind}' blocks are not supported"
                            + (": this model takes text only" if inner_kind in MEDIA_BLOCKS else " (text only)"),
                            {"i": i, "j": j, "kind": inner_kind})
            continue
        if kind in MEDIA_BLOCKS:
            raise PydanticCustomError("text_only", "block {i}: '{kind}' blocks are not supported: this model takes "
                                                   "text only", {"i": i, "kind": kind})
        raise PydanticCustomError("block_type", "block {i}: '{kind}' blocks are not supported here (expected one "
                                                "of {allowed})", {"i": i, "kind": kind, "allowed": ", ".join(allowed)})
    return v


class Message(_Lenient):
    # "system": a turn Claude Code sends inside messages (Anthropic's API wants `system`): joined into the system prompt
    role: Literal["user", "assistant", "system"]
    content: list[Block]  # a string: one text block

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, v: Any, info: ValidationInfo) -> Any:
        allowed = ("text",) if info.data.get("role") == "system" else ("text", "tool_use", "tool_result",
                                                                        *IGNORED_BLOCKS)
        return _check_blocks(_as_blocks(v), allowed=allowed)

    @field_validator("content")
    @classmethod
    def _by_role(cls, blocks: list[Any], info: ValidationInfo) -> list[Any]:
        role = info.data.get("role")
        wrong = "tool_result" if role == "assistant" else "tool_use"  # a system turn holds text blocks only
        for i, b in enumerate(blocks):
            if b.type == wrong:
                raise PydanticCustomError("block_role", "block {i}: a '{wrong}' block cannot be in a {role} message",
                                          {"i": i, "wrong": wrong, "role": str(role)})
        return blocks


class ToolDef(_Lenient):
    name: str = Field(..., min_length=1, max_length=64)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tools_only(cls, v: Any) -> Any:
        kind = v.get("type") if isinstance(v, dict) else None
        if kind not in (None, "custom"):
            raise PydanticCustomError("server_tool", "'{kind}': Anthropic's server tools are not served: only client "
                                                     "tools (name, description, input_schema)", {"kind": str(kind)})
        return v


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("type 'tool' needs the tool's 'name'")
        return self


class OutputFormat(_Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(..., alias="schema")


class OutputConfig(_Lenient):
    format: OutputFormat | None = None  # structured output; `effort` means nothing here


class _Conversation(_Lenient):
    """What /v1/messages and /v1/messages/count_tokens share."""

    model: str | None = None
    messages: list[Message] = Field(..., min_length=1)
    system: list[TextBlock] | None = None  # a string: one text block
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None

    @field_validator("system", mode="before")
    @classmethod
    def _system_text(cls, v: Any) -> Any:
        return _check_blocks(_as_blocks(v), allowed=("text",))

    @field_validator("tool_choice")
    @classmethod
    def _choice_names_a_tool(cls, choice: ToolChoice | None, info: ValidationInfo) -> ToolChoice | None:
        offered = info.data.get("tools") or []  # tools come first: checked (absent here when they failed)
        if choice is not None and choice.type in ("any", "tool") and not offered:
            raise PydanticCustomError("tool_choice", "type '{kind}' needs 'tools'", {"kind": choice.type})
        if choice is not None and choice.type == "tool" and not any(t.name == choice.name for t in offered):
            raise PydanticCustomError("tool_choice", "no tool named '{name}' in 'tools'", {"name": str(choice.name)})
        return choice

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation as chat-completions messages."""
        out: list[dict[str, Any]] = []
        # the system prompt: `system`, then the text of each system turn in messages, in their order (one system
        # turn first, the one place every chat template takes it)
        system = [b.text for b in self.system or []]
        system += [b.text for m in self.messages if m.role == "system" for b in m.content if isinstance(b, TextBlock)]
        if system:
            out.append({"role": "system", "content": schemas.PART_SEPARATOR.join(system)})
        for m in self.messages:
            if m.role == "system":
                continue
            if m.role == "assistant":
                texts = [{"type": "text", "text": b.text} for b in m.content if isinstance(b, TextBlock)]
                turn: dict[str, Any] = {"role": "assistant", "content": texts or None}
                calls = [{"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
                         for b in m.content if isinstance(b, ToolUseBlock)]
                if calls:
                    turn["tool_calls"] = calls
                out.append(turn)
            else:  # tool results become tool turns, the text around them user turns, in their order
                texts: list[dict[str, Any]] = []
                for b in m.content:
                    if isinstance(b, TextBlock):
                        texts.append({"type": "text", "text": b.text})
                    elif isinstance(b, ToolResultBlock):
                        if texts:
                            out.append({"role": "user", "content": texts})
                            texts = []
                        out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
                if texts or not m.content:
                    out.append({"role": "user", "content": texts})
        return out

    def chat_body(self) -> dict[str, Any]:
        """The chat-completions body of this conversation, tools included (no sampling fields)."""
        body: dict[str, Any] = {"messages": self.chat_messages()}
        if self.tools:
            body["tools"] = [{"type": "function", "function": {
                "name": t.name, **({"description": t.description} if t.description is not None else {}),
                "parameters": t.input_schema}} for t in self.tools]
        choice = self.tool_choice
        if choice is not None:
            if choice.type == "tool":
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            else:
                body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
            body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
        return body


class CountTokensRequest(_Conversation):
    pass


class MessagesRequest(_Conversation):
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None

    @field_validator("max_tokens", "temperature", "top_p", "top_k")
    @classmethod
    def _in_range(cls, v: Any, info: Any) -> Any:
        return v if v is None else check_param(info.field_name, v, label=info.field_name)

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(v) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        return v

    def chat_body(self) -> dict[str, Any]:
        body = super().chat_body()
        body.update(max_tokens=self.max_tokens, stream=self.stream)
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.output_config is not None and self.output_config.format is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": self.output_config.format.schema_}}
        return body


# chat-completions field names in errors the chat path raises, as this API names them
PARAMS = {"max_tokens": "max_tokens", "stop": "stop_sequences", "prompt": "messages", "messages": "messages",
          "tools": "tools", "tool_choice": "tool_choice", "response_format": "output_config.format"}


# ---------------------------------------------------------------- the answer


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def stop_reason(done: Finished, has_calls: bool) -> str:
    if done.finish_reason == "length":  # the context's end: as Anthropic's API stops at the context window
        return "model_context_window_exceeded" if done.context_full else "max_tokens"
    if has_calls:
        return "tool_use"
    return "stop_sequence" if done.stop_sequence is not None else "end_turn"


def usage(done: Finished) -> dict[str, Any]:
    """Anthropic's usage: input_tokens are the prompt tokens prefilled for this request, and those the
    slot already held are cache_read_input_tokens (their sum is the whole prompt, as Anthropic counts)."""
    cached = int(done.timings.get("cache_n", 0))
    return {"input_tokens": done.prompt_tokens - cached, "output_tokens": done.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as tool_use's input: cut off (max_tokens), what they hold so far; not an object: {}."""
    return tools.partial_object(arguments)


def _sse(kind: str, obj: dict[str, Any]) -> dict[str, str]:
    return {"event": kind, "data": json.dumps({"type": kind, **obj}, separators=(",", ":"))}


@dataclass
class MessageAnswer:
    """One request's answer as an Anthropic message, whole or streamed."""

    mid: str
    model: str
    plan: ToolPlan | None
    prompt_tokens: int

    def _message(self, content: list[dict[str, Any]], reason: str | None, stop: str | None,
                 use: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": stop, "usage": use}

    def message(self, done: Finished) -> dict[str, Any]:
        text, calls = answers.split(self.plan, done.text)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
        content += [{"type": "tool_use", "id": new_id("toolu"), "name": c.name, "input": tool_input(c.arguments)}
                    for c in calls]
        out = self._message(content, stop_reason(done, bool(calls)), done.stop_sequence if not calls else None,
                            usage(done))
        out["timings"] = done.timings
        return out

    async def stream(self, events: AsyncIterator[answers.Event]) -> AsyncIterator[dict[str, str]]:
        start = self._message([], None, None, {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                                               "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
        yield _sse("message_start", {"message": start})
        yield _sse("ping", {})
        index = -1  # the open block's index
        open_kind: str | None = None  # "text" | "tool_use" | None
        n_calls = 0
        arguments = ""  # the open tool_use block's input JSON so far

        def close() -> list[dict[str, str]]:
            nonlocal open_kind
            if open_kind is None:
                return []
            open_kind = None
            return [_sse("content_block_stop", {"index": index})]

        def begin(block: dict[str, Any]) -> list[dict[str, str]]:
            nonlocal index, open_kind
            out = close()
            index += 1
            open_kind = block["type"]
            return out + [_sse("content_block_start", {"index": index, "content_block": block})]

        def json_delta(part: str) -> dict[str, str]:
            return _sse("content_block_delta", {"index": index,
                                                "delta": {"type": "input_json_delta", "partial_json": part}})

        async for x in answers.blocks(events, self.plan):
            out: list[dict[str, str]] = []
            if isinstance(x, Finished):
                if x.finish_reason == "error":
                    status = x.status if x.status >= 400 else 500
                    yield {"event": "error", "data": json.dumps(error_body(status, x.error or "generation failed"))}
                    return
                if open_kind == "tool_use" and x.finish_reason == "length":
                    # a call cut off: its JSON closed where it ends, so that the pieces join to the input a whole
                    # answer gives (what the arguments hold so far)
                    suffix = tools.closing_suffix(arguments)
                    if suffix:
                        out.append(json_delta(suffix))
                out += close()
                reason = stop_reason(x, n_calls > 0)
                out.append(_sse("message_delta", {
                    "delta": {"stop_reason": reason, "stop_sequence": x.stop_sequence if not n_calls else None},
                    "usage": usage(x), "timings": x.timings}))
                out.append(_sse("message_stop", {}))
            elif isinstance(x, answers.BlockStart):
                if x.name is None:
                    out += begin({"type": "text", "text": ""})
                else:
                    n_calls += 1
                    arguments = ""
                    out += begin({"type": "tool_use", "id": new_id("toolu"), "name": x.name, "input": {}})
            elif isinstance(x, str):
                out.append(_sse("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": x}}))
            else:
                arguments += x.text
                out.append(json_delta(x.text))
            for e in out:
                yield e
