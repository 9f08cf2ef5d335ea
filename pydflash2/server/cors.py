"""Cross-origin requests (browser front-ends): Starlette's CORSMiddleware around
everything the server answers, 503s while loading and 401s included, so that a
page on another origin can call the API and read its errors. Preflights
(OPTIONS with Access-Control-Request-Method) are answered by the middleware
before any route or key check, as browsers send them without credentials.

The defaults allow any origin, method and header, as llama-server and vLLM do
(`serve --cors-origins ''` turns CORS off: browsers then refuse cross-origin
answers)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

# response headers a page's script may read besides the CORS-safelisted ones
EXPOSED = ("X-Request-Id", "Retry-After")
PREFLIGHT_MAX_AGE_S = 600


@dataclass(frozen=True)
class CorsOptions:
    origins: tuple[str, ...] = ("*",)  # none: CORS off
    methods: tuple[str, ...] = ("*",)
    headers: tuple[str, ...] = ("*",)


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated option value ("a, b,,c") as its items."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def with_cors(app: ASGIApp, opts: CorsOptions) -> ASGIApp:
    if not opts.origins:
        return app
    return CORSMiddleware(app, allow_origins=list(opts.origins), allow_methods=list(opts.methods),
                          allow_headers=list(opts.headers), expose_headers=list(EXPOSED),
                          max_age=PREFLIGHT_MAX_AGE_S)
