"""A GGUF's chat template, rendered as llama-cpp-python renders it
(Jinja2ChatFormatter: jinja2, HF's tojson, raise_exception, strftime_now), with
tools, and what the template can do with them.

    tmpl = ChatTemplate.of(llm)
    text, add_bos = tmpl.render(messages, tools=tools)
    tokens = chat_prompt_tokens(llm, messages)

Capabilities are probed by rendering, as llama.cpp's common/jinja/caps.cpp
does: a template "has tools" when a tool's name reaches the rendered prompt,
"has tool calls" when an assistant message's call does, and wants object
arguments when the call's arguments only show as a mapping (HF templates apply
`tojson` to them), not as the JSON string OpenAI clients send.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter


@functools.lru_cache(maxsize=16)
def _formatter(template: str, eos_token: str, bos_token: str, add_generation_prompt: bool) -> Jinja2ChatFormatter:
    """Compiled once per template: compiling costs ~10-20 ms, a server pays it per request otherwise."""
    return Jinja2ChatFormatter(template=template, eos_token=eos_token, bos_token=bos_token,
                               add_generation_prompt=add_generation_prompt)


_PROBE_TOOL = "pdf2_probe_tool_7q"
_PROBE_VALUE = "pdf2_probe_value_7q"


@dataclass(frozen=True)
class TemplateCaps:
    tools: bool  # tool definitions reach the prompt
    tool_calls: bool  # an assistant message's tool calls reach the prompt
    object_arguments: bool  # calls' arguments must be mappings, not JSON strings


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    eos_token: str
    bos_token: str

    @staticmethod
    def of(llm: llama_cpp.Llama) -> ChatTemplate:
        """The model's template; ValueError without one."""
        source = llm.metadata.get("tokenizer.chat_template")
        if not source:
            raise ValueError("the target model has no chat template: pass chat=False (raw prompt) or token ids")

        def token_text(token: int) -> str:
            return "" if token < 0 else llm._model.token_get_text(token)

        return _template(source, token_text(llm.token_eos()), token_text(llm.token_bos()))

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
               **variables: Any) -> tuple[str, bool]:
        """The prompt text, and whether the tokenizer should still add BOS (the
        template did not). variables: tools, tool_choice... as the template reads them."""
        formatter = _formatter(self.source, self.eos_token, self.bos_token, add_generation_prompt)
        result = formatter(messages=list(messages), **variables)
        return result.prompt, not result.added_special

    @functools.cached_property
    def caps(self) -> TemplateCaps:
        tool = {"type": "function", "function": {
            "name": _PROBE_TOOL, "description": "probe",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}

        def with_call(arguments: Any) -> list[dict[str, Any]]:
            call = {"id": "call00001", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": arguments}}
            return [{"role": "user", "content": "User message"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                    {"role": "assistant", "content": "The tool response was 'tool response'"},
                    {"role": "user", "content": "User message"}]

        def attempt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            try:
                return self.render(messages, tools=tools)[0]
            except Exception:  # the template refuses this shape: it cannot do it
                return ""

        has_tools = _PROBE_TOOL in attempt([{"role": "user", "content": "User message"}], [tool])
        object_args = _PROBE_VALUE in attempt(with_call({"arg": _PROBE_VALUE}), [tool])
        calls = object_args or _PROBE_VALUE in attempt(with_call(json.dumps({"arg": _PROBE_VALUE})), [tool])
        return TemplateCaps(tools=has_tools, tool_calls=calls, object_arguments=object_args)

    def prepare_messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI messages as this template reads them (llama.cpp's workarounds): a
        call's JSON-string arguments become a mapping where the template wants one,
        and a message with tool calls gets content "" instead of none."""
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                if m.get("content") is None:
                    m["content"] = ""
                if self.caps.object_arguments:
                    m["tool_calls"] = [_object_arguments(c) for c in m["tool_calls"]]
            out.append(m)
        return out


@functools.lru_cache(maxsize=8)
def _template(source: str, eos_token: str, bos_token: str) -> ChatTemplate:
    return ChatTemplate(source, eos_token, bos_token)  # one per template: its caps are probed once


def _object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise ValueError(f"tool call arguments are not JSON: {e}") from None
    return {**call, "function": fn}


def chat_prompt_tokens(llm: llama_cpp.Llama, messages: Sequence[dict[str, Any]], **variables: Any) -> list[int]:
    """Token ids of chat messages rendered by the GGUF's chat template, as
    llama-cpp-python renders them (Jinja2ChatFormatter); ValueError without one."""
    text, add_bos = ChatTemplate.of(llm).render(messages, **variables)
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
