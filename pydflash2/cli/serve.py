"""`pydflash2 serve` (also `python -m pydflash2.server`): the OpenAI-compatible
HTTP server with continuous batching over the draft-verify engine."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from ..grammar_limits import DEFAULT_LIMITS, LIMIT_CAPS, GrammarLimits, option_name
from . import common
from .common import CliError, Parser

if TYPE_CHECKING:
    from ..server.scheduler import SchedulerHooks

NAME = "serve"


def add_serve_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--parallel", type=int, default=1,
                   help="slots: requests decoded together, each its own sequence (default 1); --n-ctx is per slot")
    common.add_drafting_args(p, "global")
    common.add_exact_arg(p, what=" whatever else is in the batch")
    common.add_flash_attn_arg(p)
    p.add_argument("--api-key", action="append", default=[],
                   help="require Authorization: Bearer KEY (all but /health); repeat it or separate keys with "
                        "commas for several (visible in `ps`: prefer --api-key-file or PYDFLASH2_API_KEY)")
    p.add_argument("--api-key-file", default=None, help="file of API keys, one per line (# comments)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a slot; beyond that: 503 + Retry-After (default 64)")
    p.add_argument("-a", "--alias", "--model-alias", dest="model_alias", default=None,
                   help="model id /v1/models lists (default: the GGUF file name stem); requests may name any model")
    g = p.add_argument_group("sampling defaults", "what a request that leaves the field out gets (llama-server's)")
    g.add_argument("--temp", "--temperature", dest="temperature", type=common.sampling_arg("temperature"), default=0.8,
                   help="temperature (default 0.8; 0 = greedy)")
    g.add_argument("--top-k", type=common.sampling_arg("top_k"), default=40, help="top-k (default 40; 0 = off)")
    g.add_argument("--top-p", type=common.sampling_arg("top_p"), default=0.95, help="top-p (default 0.95; 1 = off)")
    g.add_argument("--min-p", type=common.sampling_arg("min_p"), default=0.05, help="min-p (default 0.05; 0 = off)")
    p.add_argument("--max-body", type=int, default=1 << 20, help="largest request body in bytes (default 1 MiB)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="info (default) logs one access line per request")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds from a request's arrival to its end: then it finishes with finish_reason "
                        "'length' (default 600; 0 = none)")
    p.add_argument("--queue-timeout", type=float, default=120.0,
                   help="seconds a request may wait for a slot before a 503 (default 120; 0 = none)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds from arrival to the request body's last byte; slower uploads get 408 and are "
                        "closed (default 30)")
    p.add_argument("--stall-timeout", type=float, default=60.0,
                   help="/health turns 503 'stalled' when the step loop makes no progress this long while work is "
                        "pending (default 60; 0 = off)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, seconds in-flight requests may take to finish (default 30)")
    p.add_argument("--keep-alive-timeout", type=float, default=30.0,
                   help="seconds an idle keep-alive connection stays open (default 30: longer than the 5 s after "
                        "which httpx/openai clients drop pooled connections, so they never reuse one being closed)")
    lim = p.add_argument_group("grammar and schema limits", "a request past one gets a 400 naming it (llama.cpp's "
                               "grammar parser recurses: these keep a request from overflowing its stack)")
    for name, what in (("grammar_bytes", "size of a GBNF grammar, given or converted from a JSON schema"),
                       ("grammar_depth", "nesting of ( ) groups in a GBNF grammar"),
                       ("grammar_rules", "GBNF rules, defined and derived (one per group and per * + ?, n-m "
                                         "per {m,n})"),
                       ("grammar_repeat", "the largest bound of a GBNF {m,n} (llama.cpp ignores a larger upper "
                                          "bound)"),
                       ("schema_repeat", "JSON schema: maxLength, minLength, maxItems, minItems (llama.cpp refuses "
                                         "the converter's grammar past 1000)"),
                       ("schema_enum", "JSON schema: values of one enum, alternatives of one anyOf / oneOf")):
        default, cap = getattr(DEFAULT_LIMITS, name), LIMIT_CAPS.get(name)
        lim.add_argument(option_name(name), dest=f"max_{name}", type=int, default=default, metavar="N",
                         help=f"{what} (default {default}" + (f", at most {cap})" if cap else ")"))
    p.add_argument("--ssl-keyfile", default=None, help="TLS private key (PEM); with --ssl-certfile: https")
    p.add_argument("--ssl-certfile", default=None, help="TLS certificate chain (PEM)")
    c = p.add_argument_group("CORS", "which browser pages on other origins may call the server (llama-server's and "
                                     "vLLM's defaults: any)")
    c.add_argument("--cors-origins", default="*", metavar="LIST",
                   help="comma-separated origins allowed (default '*': any; '' turns CORS off)")
    c.add_argument("--cors-methods", default="*", metavar="LIST", help="allowed methods (default '*')")
    c.add_argument("--cors-headers", default="*", metavar="LIST", help="allowed request headers (default '*')")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="OpenAI-compatible HTTP server (continuous batching, /metrics)")
    add_serve_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, hooks: SchedulerHooks | None = None) -> int:
    """hooks: the scheduler's fault points, for tests (pydflash2_testing.fault_server)."""
    if args.parallel < 1:
        raise CliError(f"--parallel must be >= 1, got {args.parallel}")
    if args.max_queue < 0:
        raise CliError(f"--max-queue must be >= 0, got {args.max_queue}")
    if not 0 < args.port < 65536:
        raise CliError(f"--port must be in 1..65535, got {args.port}")
    common.check_run_args(args)
    for name in ("timeout", "queue_timeout", "body_timeout", "stall_timeout", "shutdown_timeout",
                 "keep_alive_timeout"):
        if not (math.isfinite(getattr(args, name)) and getattr(args, name) >= 0):
            raise CliError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {getattr(args, name)}")
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise CliError("--ssl-keyfile and --ssl-certfile go together")
    for name in ("body_timeout", "keep_alive_timeout"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    try:
        limits = GrammarLimits(**{f.name: getattr(args, f"max_{f.name}") for f in fields(GrammarLimits)})
    except ValueError as e:
        raise CliError(str(e)) from None
    from ..server.cors import CorsOptions, split_list

    cors = CorsOptions(split_list(args.cors_origins), split_list(args.cors_methods), split_list(args.cors_headers))
    if cors.origins and not (cors.methods and cors.headers):
        raise CliError("--cors-methods and --cors-headers must name at least one item (or '*') when CORS is on")
    common.setup_devices(args)
    from ..server.app import SamplingDefaults
    from ..server.auth import load_keys
    from ..server.main import ServerOptions, serve

    try:
        api_keys = load_keys(args.api_key, args.api_key_file)
    except OSError as e:
        raise CliError(f"--api-key-file: {e}") from None

    draft = common.resolve_draft(args)  # the shipped drafter for the default model when --draft is omitted
    common.check_kv_memory(args.model, draft, args.parallel, args.n_ctx, args.n_gpu_layers)
    try:
        return serve(ServerOptions(
            model=args.model, draft=draft, host=args.host, port=args.port, n_ctx=args.n_ctx,
            parallel=args.parallel, n_max=args.n_max if draft else 0, tree_budget=args.tree_budget,
            context_drafts=_context_drafts(args),
            selector=args.selector,
            threads=args.threads, device=args.device, n_gpu_layers=args.n_gpu_layers,
            exact=args.exact, flash_attn=common.flash_attn_choice(args.flash_attn), api_keys=api_keys,
            max_queue=args.max_queue, model_alias=args.model_alias, max_body=args.max_body,
            log_level=args.log_level,
            defaults=SamplingDefaults(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                      min_p=args.min_p),
            timeout=args.timeout or None, queue_timeout=args.queue_timeout or None,
            body_timeout=args.body_timeout, stall_timeout=args.stall_timeout,
            shutdown_timeout=args.shutdown_timeout, keep_alive_timeout=args.keep_alive_timeout,
            ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, grammar_limits=limits, hooks=hooks,
            cors=cors,
        ))
    except (OSError, ValueError, RuntimeError) as e:
        raise CliError(str(e)) from None


def _context_drafts(args: argparse.Namespace) -> str:
    """--context-drafts, by default global while llama.cpp has the sequences every slot's context trees
    take (more slots: off, as asking for them says)."""
    if args.context_drafts is None and not args.exact:
        import llama_cpp

        from ..context_drafts import limits

        if args.parallel * (1 + limits().max_branches) > llama_cpp.llama_max_parallel_sequences():
            return "off"
    return common.context_drafts_choice(args, "global")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pydflash2.server`: the same options without the subcommand."""
    parser = Parser(prog="python -m pydflash2.server", description="pydflash2 OpenAI-compatible server")
    add_serve_args(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CliError as e:
        print(f"pydflash2 serve: error: {e}", file=sys.stderr)
        return 2
