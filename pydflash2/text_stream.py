"""Incremental detokenization with stop strings.

Tokens arrive a block at a time; text is released only once it can no longer
turn out to be the start of a stop string, so a stop split across tokens (or
blocks) never leaks into the output."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""  # decoded, not yet released
        self.text = ""  # released so far
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (the first in the text)

    def push(self, token: int) -> str:
        """Adds one token; returns the text that became safe to release."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(self._token_bytes(token))
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            at = min(hits)
            self.matched = min((s for s in self._stop if self._pending.find(s) == at), key=len)
            return self._release(self._pending[:at])
        if self._hold and len(self._pending) > self._hold:
            cut = len(self._pending) - self._hold
            out = self._pending[:cut]
            self._pending = self._pending[cut:]
            return self._release(out, keep_pending=True)
        if not self._hold:
            out = self._pending
            self._pending = ""
            return self._release(out, keep_pending=True)
        return ""

    def finish(self) -> str:
        """End of generation: releases what is held back (no stop matched)."""
        if self.stopped:
            return ""
        return self._release(self._pending + self._decoder.decode(b"", final=True))

    def _release(self, out: str, keep_pending: bool = False) -> str:
        if not keep_pending:
            self._pending = ""
        self.text += out
        return out
