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

    # `convert` owns its arguments (also reachable as python -m pydflash2.convert)
    if argv and argv[0] == "convert":
        from .convert.cli import main as convert_main

        return convert_main(argv[1:])

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
