"""What a request asks of the sampler chain beyond temperature and top-k/p:
grammar (GBNF, response_format, a forced tool call), penalties, logit_bias and
logprobs, turned into the keyword arguments of the engine's start() (the names
the engine binding takes: grammar, logit_bias, presence_penalty,
frequency_penalty, repeat_penalty, repeat_last_n, logprobs).

A field the engine cannot honour is refused (FieldError names it), never
dropped: which names the engine takes is read from its start() signature.
Neutral values (penalty 0 or 1, an empty logit_bias, logprobs off) ask for
nothing and pass on any engine.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from .. import json_schema
from ..grammar_limits import DEFAULT_LIMITS, GrammarLimits
from . import grammars, tools
from .schemas import ChatCompletionRequest, CompletionRequest

ENGINE_OPTIONS = ("grammar", "logit_bias", "presence_penalty", "frequency_penalty", "repeat_penalty",
                  "repeat_last_n", "logprobs")


class FieldError(ValueError):
    """A request field that is wrong or cannot be honoured here (HTTP 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def engine_features(engine: Any) -> frozenset[str]:
    """The ENGINE_OPTIONS the engine's prepare() (the sampler chain start() takes) accepts.
    Logprobs also need a way back: the engine's logprobs(slot, committed)."""
    params = inspect.signature(engine.prepare).parameters
    names = {n for n in ENGINE_OPTIONS if n in params}
    if "logprobs" in names and not callable(getattr(engine, "logprobs", None)):
        names.discard("logprobs")
    return frozenset(names)


@dataclass(frozen=True)
class ToolPlan:
    """How to read tool calls out of an answer."""

    fmt: tools.ToolCallFormat
    names: frozenset[str]
    parallel: bool


@dataclass(frozen=True)
class Steering:
    engine_options: dict[str, Any]  # extra keyword arguments of engine.start()
    tool_plan: ToolPlan | None = None
    logprobs: int | None = None  # top alternatives per token, None: no logprobs
    # schema keywords the grammar does not enforce, as keyword@place (json_schema.unenforced): accepted,
    # as llama-server accepts them, and named in the access log and a response header
    unenforced: tuple[str, ...] = ()


def _require(features: frozenset[str], name: str, param: str) -> None:
    if name not in features:
        raise FieldError(param, f"this server's engine cannot honour '{param}' yet (no {name} in its sampler chain)")


def build(body: CompletionRequest | ChatCompletionRequest, *, features: frozenset[str], n_vocab: int, n_ctx: int,
          vocab: Any, template: Any = None, limits: GrammarLimits = DEFAULT_LIMITS) -> Steering:
    """Checks and converts a request's steering fields. template: the chat
    template (chat requests), for tools; limits: the grammar and JSON-schema limits."""
    opts: dict[str, Any] = {}
    grammar_param: str | None = None
    unenforced: list[str] = []

    if body.grammar is not None:
        opts["grammar"], grammar_param = body.grammar, "grammar"
    if body.response_format is not None:
        try:
            g = grammars.response_format_grammar(body.response_format, limits)
        except ValueError as e:
            raise FieldError("response_format", str(e)) from None
        if g is not None:
            if grammar_param:  # as llama-server: one or the other
                raise FieldError("response_format", "give either 'grammar' or a JSON 'response_format', not both")
            opts["grammar"], grammar_param = g, "response_format"
            unenforced += grammars.response_format_unenforced(body.response_format)

    plan = None
    if isinstance(body, ChatCompletionRequest):
        plan, tool_grammar, tools_unenforced = _tools(body, template)
        if tool_grammar is not None:
            param = "tools" if plan is not None and plan.fmt is tools.GENERIC else "tool_choice"
            if grammar_param:
                what = ("tools on a template without a tool format (answered through the generic format's grammar)"
                        if param == "tools" else "a forced tool call")
                raise FieldError(param, f"{what} cannot be combined with '{grammar_param}'")
            opts["grammar"], grammar_param = tool_grammar, param
            unenforced += tools_unenforced
    if grammar_param:
        _require(features, "grammar", grammar_param)
        try:
            grammars.check_grammar(vocab, opts["grammar"], limits)
        except ValueError as e:
            raise FieldError(grammar_param, str(e)) from None

    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repeat_penalty", 1.0)):
        v = getattr(body, name)
        if v is not None and v != neutral:
            _require(features, name, name)
            opts[name] = v
    if body.repeat_last_n is not None and any(k in opts for k in ("presence_penalty", "frequency_penalty",
                                                                    "repeat_penalty")):
        _require(features, "repeat_last_n", "repeat_last_n")
        opts["repeat_last_n"] = n_ctx if body.repeat_last_n == -1 else body.repeat_last_n

    try:
        bias = body.logit_bias_ids()
    except ValueError as e:
        raise FieldError("logit_bias", str(e)) from None
    bad = [t for t in bias if not 0 <= t < n_vocab]
    if bad:
        raise FieldError("logit_bias", f"token ids outside the vocabulary (0..{n_vocab - 1}): {bad[:5]}")
    bias = {t: b for t, b in bias.items() if b != 0}
    if bias:
        _require(features, "logit_bias", "logit_bias")
        opts["logit_bias"] = bias

    n_top = _logprobs(body)
    if n_top is not None:
        param = "logprobs"
        _require(features, "logprobs", param)
        opts["logprobs"] = max(1, n_top)  # the engine's count: 0 would mean off; the token's own always comes
    return Steering(opts, plan, n_top, tuple(unenforced))


def _logprobs(body: CompletionRequest | ChatCompletionRequest) -> int | None:
    if isinstance(body, ChatCompletionRequest):
        if not body.logprobs:
            if body.top_logprobs:
                raise FieldError("top_logprobs", "needs logprobs: true")
            return None
        return body.top_logprobs or 0
    return body.logprobs


def uses_generic_format(body: ChatCompletionRequest, template: Any) -> bool:
    """Whether a chat request's tools go through the generic format: tools offered (and not
    tool_choice "none") to a template without a call format of its own."""
    if not body.tools or body.tool_choice == "none":
        return False
    caps = template.caps if template is not None else None
    return caps is None or not caps.tools or tools.detect_format(template.source) is None


def template_input(body: ChatCompletionRequest, template: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and variables a chat request renders the template with: as given, or (a template
    that does not render tools or tool calls) shaped as llama.cpp's generic format shapes them."""
    caps = template.caps if template is not None else None
    messages = body.template_messages()
    generic = uses_generic_format(body, template)
    if generic or (caps is not None and not caps.tool_calls and any(m.get("tool_calls") for m in messages)):
        defs = [t.function.model_dump(exclude_none=True) for t in body.tools or []]
        return tools.generic_messages(messages, defs, calls=bool(body.tools) and body.tool_choice != "none"), {}
    return messages, body.template_variables()


def _tools(body: ChatCompletionRequest, template: Any) -> tuple[ToolPlan | None, str | None, list[str]]:
    """The parse plan, the grammar (forced call, or the generic format's answer) for a chat request's tools,
    and the keywords of the parameters it constrains that it does not enforce."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise FieldError("tool_choice", "needs 'tools'")
        return None, None, []
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise FieldError("tools", "two tools have the same name")
    if choice == "none":
        return None, None, []  # the template still sees the tools; no call is read
    generic = uses_generic_format(body, template)
    fmt = tools.GENERIC if generic else tools.detect_format(template.source)
    assert fmt is not None
    defs = [t.function.model_dump() for t in body.tools]
    plan = ToolPlan(fmt, frozenset(names), body.parallel_tool_calls)
    if choice not in (None, "auto", "required"):
        defs = [d for d in defs if d["name"] == choice.function.name]
        if not defs:
            raise FieldError("tool_choice", f"no tool named '{choice.function.name}' in 'tools'")
        plan = ToolPlan(fmt, frozenset([defs[0]["name"]]), False)
    elif choice in (None, "auto") and not generic:
        return plan, None, []  # unconstrained: the parameters' schemas only reach the template
    constrained = not generic or choice not in (None, "auto")  # auto generic calls: any arguments
    unenforced = [k for d in defs for k in json_schema.unenforced(d.get("parameters"), f"/{d['name']}")] \
        if constrained else []
    try:
        if generic:  # the whole answer is constrained: calls, or (auto) a response
            return plan, tools.generic_grammar(defs, plan.parallel, required=constrained), unenforced
        return plan, fmt.grammar(defs, plan.parallel), unenforced
    except Exception as e:  # the converter raises bare exceptions on what it cannot express
        raise FieldError("tools", f"the tools' parameters cannot be turned into a grammar: {e}") from None
