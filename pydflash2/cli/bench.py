"""`pydflash2 bench`: every configuration against plain decoding, interleaved in one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import (
    CliError,
    add_exact_arg,
    add_model_args,
    parse_context_drafts,
    parse_list,
    parse_n_max,
    parse_tree_budget,
    resolve_draft,
    sampling_arg,
    setup_devices,
)

NAME = "bench"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="benchmark configurations against plain decoding")
    add_model_args(p)
    add_exact_arg(p)
    p.add_argument("--prompts", help="text file, one prompt per line (default: a built-in set)")
    p.add_argument("--n-max", default="0,auto", help="comma list, e.g. 0,2,4,auto (0 is always added)")
    p.add_argument("--tree-budget", default="0", metavar="N[,N...]",
                   help="comma list of tree budgets or auto: each > 0 runs every drafting --n-max with tree "
                        "verification of that many nodes (0 = the chain, default)")
    p.add_argument("--context-drafts", default="off", metavar="MODE[,MODE...]",
                   help="comma list of off, request, global: each mode other than off runs every configuration "
                        "also with drafts from the context (with --n-max 0: context drafts alone)")
    p.add_argument("--temperature", default="0", help="comma list of temperatures")
    p.add_argument("--selector", default="auto", help="comma list of selectors")
    p.add_argument("--max-tokens", type=sampling_arg("max_tokens"), default=64)
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats of the whole set")
    p.add_argument("--raw", action="store_true", help="prompts without the chat template")
    p.add_argument("--out", default="bench_out", help="folder for bench.json and the PNG plots")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .._native import NativeError
    from ..bench import DEFAULT_PROMPTS, BenchConfig, run_bench
    from ..models import resolve_target

    prompts = DEFAULT_PROMPTS
    if args.prompts:
        try:
            prompts = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        except OSError as e:
            raise CliError(f"--prompts: {e}") from None
        if not prompts:
            raise CliError(f"--prompts: {args.prompts} holds no prompt")
    n_maxes = parse_list(args.n_max, parse_n_max, "--n-max")
    temperatures = parse_list(args.temperature, sampling_arg("temperature"), "--temperature")
    tree_budgets = parse_list(args.tree_budget, parse_tree_budget, "--tree-budget")
    selectors = parse_list(args.selector, str, "--selector")
    context_drafts = parse_list(args.context_drafts, parse_context_drafts, "--context-drafts")
    setup_devices(args)
    try:
        target = resolve_target(args.model)
    except OSError as e:
        raise CliError(str(e)) from None
    if not target.is_file():
        raise CliError(f"target model not found: {target}")
    config = BenchConfig(
        model=str(target), draft=resolve_draft(args), prompts=prompts, n_maxes=n_maxes, temperatures=temperatures,
        selectors=selectors, max_tokens=args.max_tokens, repeats=args.repeats, chat=not args.raw,
        n_ctx=args.n_ctx, n_threads=args.threads, device=args.device, n_gpu_layers=args.n_gpu_layers,
        out_dir=Path(args.out), exact=args.exact, tree_budgets=tree_budgets, context_drafts=context_drafts,
    )
    from ..exactness import ExactnessUnavailable

    try:
        return run_bench(config)
    # an unloadable model, a bad drafter or a mismatched pair; --exact on a variant build
    except (ValueError, NativeError, ExactnessUnavailable) as e:
        raise CliError(str(e)) from None
