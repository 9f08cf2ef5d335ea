"""OpenAI request bodies (what the server accepts) and response objects (what
the official `openai` client parses). Unknown request fields are ignored, as
OpenAI-compatible servers do; supported ones are checked strictly."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..sampling import check_param
from .validation import Int32

MAX_STOP = 4


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    # OpenAI's newer name of max_tokens (langchain-openai and pydantic-ai send only this one); an alias,
    # as in llama-server
    max_completion_tokens: int | None = None
    # None: the server's default (llama-server's: 0.8, 0.95, 40, 0.05; `serve --temp/--top-p/--top-k/--min-p`)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Int32 = 1
    stream: bool = False
    # extension (as vLLM's): the completion's token ids in choices[0].token_ids (non-streamed answers)
    return_token_ids: bool = False

    @field_validator("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens")
    @classmethod
    def _in_range(cls, v: Any, info: Any) -> Any:
        """The ranges the CLI and the Python API check too (pydflash2.sampling.check_param)."""
        name = "max_tokens" if info.field_name == "max_completion_tokens" else info.field_name
        return v if v is None else check_param(name, v, label=info.field_name)

    @model_validator(mode="after")
    def _one_max_tokens(self) -> _Sampling:
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError(f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                                 f"({self.max_completion_tokens}) differ: give one of them")
            self.max_tokens = self.max_completion_tokens
        return self

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n = 1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


# ------------------------------------------ constraints, penalties, logprobs, tools (issue 24)

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat top_logprobs; completions' logprobs take the same here


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Steering(BaseModel):
    """Fields that constrain or reshape sampling (what llama-server and
    llama-cpp-python's server take). Their values are checked here; whether
    the engine can honour them is checked by the handler (400 naming the field)."""

    model_config = ConfigDict(extra="ignore")

    grammar: str | None = None  # GBNF, root rule "root"
    response_format: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None  # llama.cpp's: 1 = off
    repeat_last_n: int | None = None  # tokens the penalties look back; -1 = the context, 0 = off
    # OpenAI: {"token id": bias}; llama-server also takes [[token id, bias], ...]
    logit_bias: dict[str, float] | list[tuple[int, float]] | None = None
    stream_options: StreamOptions | None = None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and -2 <= v <= 2):
            raise ValueError("must be in [-2, 2]")
        return v

    @field_validator("repeat_penalty")
    @classmethod
    def _repeat_penalty(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError("must be a finite number > 0 (1 = off)")
        return v

    @field_validator("repeat_last_n")
    @classmethod
    def _repeat_last_n(cls, v: int | None) -> int | None:
        return v if v is None else check_param("repeat_last_n", v)

    @field_validator("grammar")
    @classmethod
    def _grammar(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("the grammar is empty")
        return v

    def logit_bias_ids(self) -> dict[int, float]:
        """logit_bias with integer token ids (ValueError on a key that is not one)."""
        if self.logit_bias is None:
            return {}
        items = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        out: dict[int, float] = {}
        for k, bias in items:
            try:
                tok = int(k)
            except ValueError:
                raise ValueError(f"key {k!r} is not a token id") from None
            if not math.isfinite(bias) and bias != -math.inf:
                raise ValueError(f"bias {bias} for token {tok} is not a number")
            out[tok] = float(bias)
        return out


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(..., min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    class Name(BaseModel):
        model_config = ConfigDict(extra="ignore")
        name: str

    type: Literal["function"]
    function: Name


class CompletionRequest(_Sampling, _Steering):
    prompt: str | list[str] | list[int] = Field(...)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # top alternatives per token (0: the token's own)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt is empty")
            if isinstance(v[0], str) and len(v) != 1:
                raise ValueError("only one prompt per request is supported")
        return v


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


# llama.cpp joins the text parts of a content array with a newline (common/chat.cpp)
PART_SEPARATOR = "\n"


class ToolCallMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    class Function(BaseModel):
        model_config = ConfigDict(extra="ignore")
        name: str
        arguments: str | dict[str, Any] = "{}"

    id: str | None = None
    type: Literal["function"] = "function"
    function: Function


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallMessage] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        """Only text parts reach the model: any other kind (image_url, input_audio, file...) is a 400
        saying so, rather than a type error."""
        if isinstance(v, list):
            for i, part in enumerate(v):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise PydanticCustomError("text_only", "part {i}: '{kind}' parts are not supported: this model "
                                                           "takes text only", {"i": i, "kind": kind})
        return v

    def as_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = PART_SEPARATOR.join(p.text for p in content)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatCompletionRequest(_Sampling, _Steering):
    messages: list[ChatMessage] = Field(..., min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_dict() for m in self.messages]

    def template_variables(self) -> dict[str, Any]:
        """What the chat template reads beside the messages: tools, tool_choice."""
        if not self.tools:
            return {}
        choice = self.tool_choice
        return {"tools": [t.model_dump(exclude_none=True) for t in self.tools],
                "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else choice}


# ---------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def system_fingerprint() -> str:
    """What answers carry as `system_fingerprint` (llama-server sends its build): this package's
    version and the llama-cpp-python build (so llama.cpp's) it runs on."""
    import llama_cpp

    from .. import __version__

    return f"pydflash2-{__version__}-llama-cpp-python-{llama_cpp.__version__}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; cached_tokens: prompt tokens the slot already held (not prefilled again),
    OpenAI's prompt_tokens_details.cached_tokens."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def completion(rid: str, model: str, text: str, finish: str | None, use: dict[str, Any] | None,
               chunk: bool = False, created: int | None = None, fingerprint: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid, "object": "text_completion", "created": now() if created is None else created, "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None or not chunk:
        out["usage"] = use
    return out


def chat_completion(rid: str, model: str, text: str, finish: str, use: dict[str, Any],
                    created: int | None = None, fingerprint: str | None = None) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": now() if created is None else created, "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                     "finish_reason": finish}],
        "usage": use,
    }


def chat_chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None,
               use: dict[str, Any] | None = None, created: int | None = None,
               fingerprint: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid, "object": "chat.completion.chunk", "created": now() if created is None else created,
        "model": model, "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None:
        out["usage"] = use
    return out


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
