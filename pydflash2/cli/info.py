"""`pydflash2 info [DRAFTER.gguf [--target T.gguf]]`: the native build and its backends, or a drafter's
hyperparameters, and whether it fits a target."""

from __future__ import annotations

import argparse
import json

from .common import CliError

NAME = "info"
# how the drafter's features are read from a target (pydflash2.capture), in words
CAPTURE_WORDS = {"tap": "llama.cpp's layer-input taps", "callback": "pydflash2's graph evaluation callback"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="show the native build and backends, or inspect a drafter GGUF")
    p.add_argument("file", nargs="?", help="drafter GGUF to check against the dflash contract")
    p.add_argument("--target", metavar="T.gguf",
                   help="also check that the drafter fits this target GGUF (the converter's checks: hidden size, "
                        "vocabulary, tapped layers, MASK token), one line per mismatch; the exit status is 1 when "
                        "it does not fit ('smollm2': the default target)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _fit(target: str, hp: dict) -> tuple[list[str], list[str], str]:
    """(problems, warnings, capture path) of the drafter hp (inspect_drafter's numbers) on target; the
    capture path is how a Speculator reads the drafter's features from it (pydflash2.capture)."""
    from ..capture import capture_path
    from ..models import resolve_target
    from ..ollama.modelfile import ModelfileError, read_target

    try:
        path = resolve_target(target)
        if not path.is_file():
            raise CliError(f"--target: {path} does not exist" if not path.exists() else f"--target: {path} is "
                           "not a file")
        facts = read_target(path)
        return (*facts.fit(path, hp), capture_path(facts.arch))
    except (FileNotFoundError, ModelfileError) as e:
        raise CliError(f"--target: {e}") from None


def run(args: argparse.Namespace) -> int:
    from ..info import DrafterFileError, inspect_drafter, native_info

    info = native_info()
    if args.target is not None and args.file is None:
        raise CliError("--target needs a drafter GGUF to check against it")
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
    problems, notes, capture = _fit(args.target, hp) if args.target is not None else ([], [], "")
    status = 1 if problems else 0
    if args.json:
        fit = {"fit": {"target": args.target, "fits": not problems, "problems": problems, "warnings": notes,
                       "capture_path": capture}}
        print(json.dumps({**hp, **fit} if args.target is not None else hp, indent=2))
        return status
    kind = "DFlash2" if hp["version"] == 2 else "DFlash"
    print(f"{args.file}: {kind} drafter, {hp['n_params'] / 1e6:.2f} M parameters in {hp['n_tensors']} tensors")
    print(f"backend devices: {', '.join(d['name'] for d in info['devices'])}")
    for key, value in hp.items():
        print(f"  {key:<24} {value}")
    if args.target is not None:
        for line in problems:
            print(f"does not fit {args.target}: {line}")
        for line in notes:
            print(f"warning: {line}")
        if not problems:
            print(f"fits {args.target}")
        print(f"capture: {capture} ({CAPTURE_WORDS[capture]})")
    return status
