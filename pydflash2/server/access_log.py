"""Request ids and the access log, as an ASGI middleware around everything else.

Each HTTP request gets an id: the client's X-Request-Id when it sends a sane one
(printable ASCII, at most 128 characters), else a new one; the response echoes
it in X-Request-Id. The request's arrival time and id go into scope["state"]
(request.state.arrival / request.state.request_id for the handlers). When the
response ends, one line at INFO on the "pydflash2.access" logger:

    rid=... POST /v1/completions 200 prompt=12 completion=16 tau=2.29 finish=length 1.234s

`finish=length(context)` where the answer reached the end of the context, and, where they apply,
`max_tokens=32000->1012` (max_tokens capped to the context left after the prompt), and the notes a
handler leaves in the request's state, each also a response header (NOTES): `ignored_tools=web_search,...`
(hosted tools left out of the prompt) and `unenforced=uniqueItems@/tags,...` (schema keywords accepted
and not enforced by the grammar).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("pydflash2.access")
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
HEADER = b"x-request-id"
# what a handler notes in request.state (a list of names): its access-log field and its response header
NOTES = {"ignored_tools": ("ignored_tools", b"x-pydflash2-ignored-tools"),
         "unenforced_schema": ("unenforced", b"x-pydflash2-unenforced-schema")}


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            text = value.decode("latin-1")
            if _REQUEST_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex


def _note(names: list[str], most: int = 20) -> str:
    """A note's names as a header value and log field: percent-encoded (a schema's property names are
    the client's: any Unicode, spaces, commas), comma-separated, the first `most` of them."""
    shown = ",".join(quote(n, safe="@/_-.:$~") for n in names[:most])
    return shown + (f",...(+{len(names) - most})" if len(names) > most else "")


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        rid = _request_id(scope)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["arrival"], state["request_id"] = t0, rid
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                notes = [(header, _note(state[key]).encode("ascii")) for key, (_, header) in NOTES.items()
                         if state.get(key)]
                message["headers"] = [*message.get("headers", ()), (HEADER, rid.encode("latin-1")), *notes]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self._log(scope, state, rid, status, time.perf_counter() - t0)

    @staticmethod
    def _log(scope: Scope, state: dict[str, Any], rid: str, status: int, seconds: float) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        parts = [f"rid={rid}", scope["method"], scope["path"], str(status or "-")]
        gen = state.get("generation")
        outcome = getattr(gen, "outcome", None)
        if outcome is not None:
            tau = "-" if outcome.tau is None else f"{outcome.tau:.2f}"
            parts += [f"prompt={outcome.prompt_tokens}", f"completion={outcome.completion_tokens}", f"tau={tau}",
                      f"finish={outcome.finish_reason}" + ("(context)" if outcome.context_full else "")]
        elif gen is not None:
            parts += [f"prompt={len(gen.prompt_tokens)}", "completion=0"]
        asked = getattr(gen, "max_tokens_asked", None)
        if asked is not None:  # capped to the context left after the prompt
            parts.append(f"max_tokens={asked}->{gen.max_tokens}")
        parts += [f"{field}={_note(state[key])}" for key, (field, _) in NOTES.items() if state.get(key)]
        parts.append(f"{seconds:.3f}s")
        log.info(" ".join(parts))
