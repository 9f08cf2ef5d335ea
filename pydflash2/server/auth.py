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


def key_matches(authorization: str, keys: tuple[str, ...]) -> bool:
    """Authorization: Bearer KEY against every key (no early exit: the time does not say which key was near)."""
    scheme, _, given = authorization.partition(" ")
    given_b = given.strip().encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given_b, key.encode("utf-8"))
    return ok and scheme.lower() == "bearer"


def context_key(authorization: str) -> str:
    """Whose past outputs may draft for a request (the global context cache, pydflash2.context_drafts):
    a digest of its bearer token, so that one key's outputs never draft for another; "" without one."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return ""
    return hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).hexdigest()


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
