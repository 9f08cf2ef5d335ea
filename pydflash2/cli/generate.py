"""`pydflash2 generate PROMPT`: one completion with speculative decoding, streamed or as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from .common import (
    CliError,
    add_drafting_args,
    add_exact_arg,
    add_flash_attn_arg,
    add_model_args,
    check_kv_memory,
    check_run_args,
    context_drafts_choice,
    flash_attn_choice,
    resolve_draft,
    sampling_arg,
    setup_devices,
)

NAME = "generate"

STATS_KEYS = ("exact", "tau", "n_max", "tree_budget", "context_drafts", "lattice_drafted", "lattice_accepted",
              "context_drafted", "context_accepted", "propose_skipped", "tokens_per_second", "ttft_s", "draft_s",
              "verify_s", "inject_s", "drafted_per_position", "accepted_per_position", "n_max_histogram", "total_s",
              "phases", "drafter_graph_builds", "plans", "decision", "explanation")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="generate text with speculative decoding")
    p.add_argument("prompt", help="the prompt (a user message unless --raw)")
    add_model_args(p)
    add_exact_arg(p)
    add_flash_attn_arg(p)
    p.add_argument("--max-tokens", type=sampling_arg("max_tokens"), default=256)
    p.add_argument("--temperature", type=sampling_arg("temperature"), default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=sampling_arg("top_p"), default=1.0)
    p.add_argument("--top-k", type=sampling_arg("top_k"), default=0, help="0 = off (default)")
    p.add_argument("--min-p", type=sampling_arg("min_p"), default=0.0)
    p.add_argument("--seed", type=sampling_arg("seed"), default=None,
                   help="any integer in -2**63..2**64-1, taken modulo 2**64 (default: a random seed)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    add_drafting_args(p, "request")
    p.add_argument("--raw", action="store_true",
                   help="no chat template: tokenize the prompt as is (BOS added, special tokens parsed)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .._native import NativeError
    from ..draft_decision import block_positions, explain_run, explain_tree_auto
    from ..exactness import ExactnessUnavailable
    from ..models import resolve_target
    from ..speculator import GenerationError, Speculator

    check_run_args(args)
    setup_devices(args)
    draft = resolve_draft(args)
    check_kv_memory(args.model, draft, 1, args.n_ctx, args.n_gpu_layers)
    try:
        spec = Speculator(
            resolve_target(args.model), draft, n_ctx=args.n_ctx, n_threads=args.threads,
            n_max=args.n_max if draft else 0, selector=args.selector, device=args.device, exact=args.exact,
            n_gpu_layers=args.n_gpu_layers, flash_attn=flash_attn_choice(args.flash_attn),
            tree_budget=args.tree_budget, context_drafts=context_drafts_choice(args, "request"),
        )
    # NativeError: a bad drafter or a mismatched pair; ExactnessUnavailable: --exact on a variant build
    except (OSError, ValueError, NativeError, ExactnessUnavailable) as e:
        raise CliError(str(e)) from None
    kwargs = dict(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, seed=args.seed, stop=args.stop, chat=not args.raw,
    )
    try:
        with spec:
            if args.json:
                out = spec.generate(args.prompt, **kwargs)
            else:
                for piece in spec.stream(args.prompt, **kwargs):
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                out = spec.last
    except (ValueError, GenerationError) as e:
        raise CliError(str(e)) from None
    assert out is not None
    s = out.stats
    # what the engine's cost model chose and measured (its stats' plans): where it chose (auto)
    explanation = None
    if draft and "auto" in (args.n_max, args.tree_budget):
        explanation = " ".join(x for x in (explain_run(s), explain_tree_auto(s)) if x) or None
    s["explanation"] = explanation
    if args.json:
        print(json.dumps({"text": out.text, "tokens": out.tokens, "finish_reason": out.finish_reason,
                          "stats": {k: s[k] for k in STATS_KEYS}}))
    else:
        print(f"[{out.finish_reason}] {len(out.tokens)} tokens, {s['tokens_per_second']:.1f} tok/s, "
              f"tau {s['tau']:.2f}, ttft {s['ttft_s'] * 1000:.0f} ms, n_max {s['n_max']}, "
              + (f"tree budget {s['tree_budget']}, " if s["tree_budget"] else "")
              + (f"context drafts {s['context_accepted']}/{s['context_drafted']} accepted "
                 f"({s['propose_skipped']} steps without the drafter), " if s["context_drafted"] else "") +
              f"exact {'yes' if s['exact'] else 'no'}", file=sys.stderr)
    width = block_positions(s)  # the block's positions (a context path may reach deeper)
    drafted, accepted = s["drafted_per_position"][:width], s["accepted_per_position"][:width]
    if not args.json and any(drafted):
        per_position = " ".join(f"{a / d:.2f}" if d else "-" for d, a in zip(drafted, accepted, strict=True))
        where = "tree depth" if s["tree_budget"] else "block position"
        print(f"acceptance per {where} 1..{len(drafted)}: {per_position} ({sum(drafted)} reached)",
              file=sys.stderr)
    if not args.json and explanation:
        print(explanation, file=sys.stderr)
    return 0
