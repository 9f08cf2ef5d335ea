"""API keys: where they come from (--api-key, --api-key-file, PYDFLASH2_API_KEY),
how a request's key is checked, and the warnings an operator should see.

Keys are compared in constant time against every configured key, and never
logged: an auth failure logs who asked for what and why it failed, not the key."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
from collections.abc import Iterable
from pathlib import Path

ENV = "PYDFLASH2_API_KEY"  # one key, or several separated by commas
log = logging.getLogger("pydflash2.server")


def _split(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def load_keys(cli_keys: Iterable[str] = (), key_file: str | os.PathLike[str] | None = None,
              environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every key from the command line (each value may hold several, comma-separated), the key
    file (one per line; blank lines and lines starting with # skipped) and the environment."""
    keys: list[str] = []
    for value in cli_keys:
        keys += _split(value)
    if key_file is not None:
        for line in Path(key_file).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    keys += _split((os.environ if environ is None else environ).get(ENV, ""))
    return tuple(dict.fromkeys(keys))  # once each, in order


def presented_key(authorization: str | None, x_api_key: str | None = None) -> str | None:
    """The key a request presents: `Authorization: Bearer KEY` (OpenAI's SDK), else `x-api-key: KEY`
    (Anthropic's SDK); None without either. An Authorization header of another scheme presents none."""
    if authorization is not None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and given.strip():
            return given.strip()
    if x_api_key is not None and x_api_key.strip():
        return x_api_key.strip()
    return None


def key_matches(authorization: str | None, keys: tuple[str, ...], x_api_key: str | None = None) -> bool:
    """The presented key (presented_key) against every key (no early exit: the time does not say which
    key was near)."""
    given = presented_key(authorization, x_api_key)
    given_b = (given or "").encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given_b, key.encode("utf-8"))
    return ok and given is not None


def context_key(authorization: str | None, x_api_key: str | None = None) -> str:
    """Whose past outputs may draft for a request (the global context cache, pydflash2.context_drafts):
    a digest of its key, so that one key's outputs never draft for another (the same key sent as a
    bearer token or as x-api-key is the same key); "" without one."""
    given = presented_key(authorization, x_api_key)
    if given is None:
        return ""
    return hashlib.sha256(given.encode("utf-8", "surrogateescape")).hexdigest()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def bind_warning(host: str, keys: tuple[str, ...]) -> str | None:
    """What to warn about before serving on host with these keys."""
    if keys or is_loopback(host):
        return None
    return (f"binding {host} without an API key: anyone who can reach this address can use the server "
            f"(set --api-key-file or {ENV})")
