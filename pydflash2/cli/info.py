"""`pydflash2 info [DRAFTER.gguf]`: the native build and its backends, or a drafter's hyperparameters."""

from __future__ import annotations

import argparse
import json

from .common import CliError

NAME = "info"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="show the native build and backends, or inspect a drafter GGUF")
    p.add_argument("file", nargs="?", help="drafter GGUF to check against the dflash contract")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..info import DrafterFileError, inspect_drafter, native_info

    info = native_info()
    if args.file is None:
        if args.json:
            print(json.dumps(info, indent=2))
            return 0
        print(f"ggml {info['ggml_version']} ({info['ggml_commit']})")
        print(f"native library: {info['native_library']}")
        print(f"system: {info['llama_system_info'].strip()}")
        if info["batch_invariant"]:
            print("batch-invariant: yes (exact speculative decoding available: --exact)")
        else:
            print(f"batch-invariant: no ({info['batch_invariant_reason']})")
        print("backend devices:")
        for dev in info["devices"]:
            mem = dev["memory_total"] / 2**30
            print(f"  {dev['name']:<10} {dev['type']:<6} {dev['description']} ({mem:.1f} GiB)")
        return 0
    try:
        hp = inspect_drafter(args.file)
    except DrafterFileError as e:
        raise CliError(f"{args.file}: {e}") from None
    if args.json:
        print(json.dumps(hp, indent=2))
        return 0
    kind = "DFlash2" if hp["version"] == 2 else "DFlash"
    print(f"{args.file}: {kind} drafter, {hp['n_params'] / 1e6:.2f} M parameters in {hp['n_tensors']} tensors")
    print(f"backend devices: {', '.join(d['name'] for d in info['devices'])}")
    for key, value in hp.items():
        print(f"  {key:<24} {value}")
    return 0
