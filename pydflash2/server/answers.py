"""One request's answer in OpenAI's shapes, whole or streamed: text, tool calls
read from it (message.tool_calls, or deltas that concatenate to the same
calls), logprobs, usage (streams: only with stream_options.include_usage, in
a last chunk with no choices, as OpenAI sends it) and llama-server's
`timings` (the last chunk of a stream)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from . import logprobs as logprob_shapes
from . import schemas, tools
from .scheduler import Finished, Logprobs
from .steering import Steering, ToolPlan


def sse(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj, separators=(",", ":"))}


DONE = {"data": "[DONE]"}


def error_events(event: Finished) -> list[dict[str, str]]:
    """A stream the scheduler ended with an error: the OpenAI error body, typed by the status the
    error stands for (the HTTP status itself went out with the first chunk), then [DONE]."""
    kind = {400: "invalid_request_error", 503: "server_busy"}.get(event.status, "server_error")
    return [sse(schemas.error_body(event.error or "generation failed", kind)), DONE]


Event = str | Logprobs | Finished


async def _ended_by_errors(stream: Callable[[AsyncIterator[Event]], AsyncIterator[dict[str, str]]],
                           events: AsyncIterator[Event]) -> AsyncIterator[dict[str, str]]:
    """An OpenAI stream: `stream`'s chunks of `events` up to an error the scheduler ends them with (`stream`
    sees its events end there), then error_events. Closing it closes both."""
    failed: list[Finished] = []

    async def before_error() -> AsyncIterator[Event]:
        async for event in events:
            if isinstance(event, Finished) and event.finish_reason == "error":
                failed.append(event)
                return
            yield event

    async with aclosing(before_error()) as ok, aclosing(stream(ok)) as chunks:
        async for c in chunks:
            yield c
    for c in error_events(failed[0]) if failed else []:
        yield c


def split(plan: ToolPlan | None, text: str) -> tuple[str, list[tools.ToolCall]]:
    """A whole answer's content and tool calls (none without tools)."""
    return tools.split_answer(plan.fmt, set(plan.names), text, plan.parallel) if plan else (text, [])


async def items(events: AsyncIterator[Event], plan: ToolPlan | None) -> AsyncIterator[tools.Item | Finished]:
    """A request's events as the answer's parts, for the shapes that stream text and tool calls
    (Anthropic's and the Responses API's): text, calls (whole, or a CallStart and its ArgsPart pieces)
    as the tool plan reads them, and last the Finished event (logprobs are not streamed there)."""
    splitter = tools.ToolCallStream(plan.fmt, set(plan.names), plan.parallel) if plan else None
    async for event in events:
        if isinstance(event, Finished):
            if event.finish_reason != "error" and splitter is not None:
                for x in splitter.finish():
                    yield x
            yield event
            return
        if isinstance(event, str):
            for x in splitter.push(event) if splitter is not None else [event]:
                yield x


@dataclass(frozen=True)
class BlockStart:
    """A new block of a streamed answer, which ends the one before: text (name None) or a tool call."""

    name: str | None = None


async def blocks(events: AsyncIterator[Event], plan: ToolPlan | None) -> AsyncIterator[
        BlockStart | str | tools.ArgsPart | Finished]:
    """A request's events as the blocks of its answer, for the shapes that stream them (Anthropic's
    content blocks, the Responses API's output items): a BlockStart, then the block's text pieces, or
    its call's arguments pieces (a whole call's at once); last the Finished event. Whitespace before a
    call or between calls is markup, dropped; an answer of no block, or of only whitespace and no call,
    gets one text block holding it, as the whole answer does."""
    kind: str | None = None  # the open block's: "text" or "call"
    held = ""  # whitespace before any block, or after a call
    n_calls = 0
    async for x in items(events, plan):
        if isinstance(x, Finished):
            if x.finish_reason != "error" and (kind is None or (held and not n_calls)):
                if kind != "text":
                    yield BlockStart()
                if held:
                    yield held
            yield x
            return
        if isinstance(x, str):
            if kind != "text":
                if not (held + x).strip():
                    held += x
                    continue
                kind = "text"
                yield BlockStart()
                x, held = held + x, ""
            yield x
        elif isinstance(x, tools.ArgsPart):
            yield x
        else:  # a call: whole (ToolCall) or its start (CallStart)
            kind, held = "call", ""
            n_calls += 1
            yield BlockStart(x.name)
            if isinstance(x, tools.ToolCall):
                yield tools.ArgsPart(x.arguments)


@dataclass
class Answer:
    rid: str
    model: str
    body: schemas.CompletionRequest | schemas.ChatCompletionRequest
    steer: Steering
    piece: Callable[[int], bytes]  # a token's text (logprobs)
    fingerprint: str | None = None  # system_fingerprint
    created: int = field(default_factory=schemas.now)  # one value for the answer and all its chunks, as OpenAI

    @property
    def include_usage(self) -> bool:
        return bool(self.body.stream_options and self.body.stream_options.include_usage)

    def _finish_reason(self, done: Finished, calls: list[tools.ToolCall]) -> str:
        # as llama-server: a finished answer with calls ends for them; one cut by max_tokens stays "length"
        return "tool_calls" if calls and done.finish_reason == "stop" else done.finish_reason

    def _usage(self, done: Finished) -> dict[str, Any]:
        return schemas.usage(done.prompt_tokens, done.completion_tokens, int(done.timings.get("cache_n", 0)))

    def _completion(self, text: str, finish: str | None, use: dict[str, Any] | None,
                    chunk: bool = False) -> dict[str, Any]:
        return schemas.completion(self.rid, self.model, text, finish, use, chunk=chunk, created=self.created,
                                  fingerprint=self.fingerprint)

    # ------------------------------------------------------------ whole answers

    def completion(self, done: Finished) -> dict[str, Any]:
        out = self._completion(done.text, done.finish_reason, self._usage(done))
        if done.logprobs is not None and self.steer.logprobs is not None:
            out["choices"][0]["logprobs"] = logprob_shapes.completion(done.logprobs, self.steer.logprobs, self.piece)
        return self._extras(out, done)

    def chat(self, done: Finished) -> dict[str, Any]:
        content, calls = split(self.steer.tool_plan, done.text)
        out = schemas.chat_completion(self.rid, self.model, content, self._finish_reason(done, calls),
                                      self._usage(done), created=self.created, fingerprint=self.fingerprint)
        if calls:
            message = out["choices"][0]["message"]
            message["tool_calls"] = [c.openai(tools.new_call_id()) for c in calls]
            message["content"] = content or None
        if done.logprobs is not None and self.steer.logprobs is not None:
            out["choices"][0]["logprobs"] = logprob_shapes.chat(done.logprobs, self.steer.logprobs, self.piece)
        return self._extras(out, done)

    def _extras(self, out: dict[str, Any], done: Finished) -> dict[str, Any]:
        if self.body.return_token_ids:
            out["choices"][0]["token_ids"] = done.tokens
        out["timings"] = done.timings
        return out

    # ------------------------------------------------------------ streams

    def _closing(self, last: dict[str, Any], done: Finished) -> list[dict[str, str]]:
        """The finishing chunk, the usage chunk when asked for, timings on the last of them."""
        chunks = [last]
        if self.include_usage:
            usage_chunk = dict(last, choices=[], usage=self._usage(done))
            chunks.append(usage_chunk)
        chunks[-1] = dict(chunks[-1], timings=done.timings)
        return [sse(c) for c in chunks] + [DONE]

    def _no_usage(self, chunk: dict[str, Any]) -> dict[str, Any]:
        # OpenAI: with include_usage every chunk carries "usage": null but the last
        chunk.pop("usage", None)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def stream_completion(self, events: AsyncIterator[Event]) -> AsyncIterator[dict[str, str]]:
        return _ended_by_errors(self._completion_chunks, events)

    def stream_chat(self, events: AsyncIterator[Event]) -> AsyncIterator[dict[str, str]]:
        return _ended_by_errors(self._chat_chunks, events)

    async def _completion_chunks(self, events: AsyncIterator[Event]) -> AsyncIterator[dict[str, str]]:
        offset = 0
        async for event in events:
            if isinstance(event, Finished):
                last = self._no_usage(self._completion("", event.finish_reason, None, chunk=True))
                for c in self._closing(last, event):
                    yield c
                return
            if isinstance(event, Logprobs):
                if self.steer.logprobs is None:
                    continue
                chunk = self._completion("", None, None, chunk=True)
                lp = logprob_shapes.completion(event.entries, self.steer.logprobs, self.piece, offset)
                offset += sum(len(t) for t in lp["tokens"])
                chunk["choices"][0]["logprobs"] = lp
                yield sse(self._no_usage(chunk))
            else:
                yield sse(self._no_usage(self._completion(event, None, None, chunk=True)))

    async def _chat_chunks(self, events: AsyncIterator[Event]) -> AsyncIterator[dict[str, str]]:
        plan = self.steer.tool_plan
        splitter = tools.ToolCallStream(plan.fmt, set(plan.names), plan.parallel) if plan else None
        n_calls = 0

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return self._no_usage(schemas.chat_chunk(self.rid, self.model, delta, finish, created=self.created,
                                                     fingerprint=self.fingerprint))

        def deltas(items: list[tools.Item]) -> list[dict[str, Any]]:
            # a call: its id and name, then its arguments (OpenAI streams them apart), piece by piece
            # where the model's format lets them be read as they come
            nonlocal n_calls
            out = []
            for x in items:
                if isinstance(x, str):
                    out.append(chunk({"content": x}))
                elif isinstance(x, tools.ArgsPart):
                    out.append(chunk({"tool_calls": [{"index": n_calls - 1, "function": {"arguments": x.text}}]}))
                else:
                    out.append(chunk({"tool_calls": [{"index": n_calls, "id": tools.new_call_id(), "type": "function",
                                                      "function": {"name": x.name, "arguments": ""}}]}))
                    n_calls += 1
                    if isinstance(x, tools.ToolCall):
                        out.append(chunk({"tool_calls": [{"index": n_calls - 1,
                                                          "function": {"arguments": x.arguments}}]}))
            return out

        yield sse(chunk({"role": "assistant", "content": ""}))
        async for event in events:
            if isinstance(event, Finished):
                for c in deltas(splitter.finish() if splitter else []):
                    yield sse(c)
                reason = "tool_calls" if n_calls and event.finish_reason == "stop" else event.finish_reason
                for c in self._closing(chunk({}, reason), event):
                    yield c
                return
            if isinstance(event, Logprobs):
                if self.steer.logprobs is None:
                    continue
                c = chunk({})
                c["choices"][0]["logprobs"] = logprob_shapes.chat(event.entries, self.steer.logprobs, self.piece)
                yield sse(c)
            else:
                for c in deltas(splitter.push(event) if splitter else [event]):
                    yield sse(c)
