"""`pydflash2 convert`: Hugging Face DFlash/DFlash2 drafter -> GGUF (the converter owns its arguments)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

NAME = "convert"


def register(sub: argparse._SubParsersAction) -> None:
    # listed in `pydflash2 --help`; the arguments are parsed by the converter itself (run_argv)
    sub.add_parser(NAME, help="convert a Hugging Face DFlash/DFlash2 drafter to GGUF", add_help=False)


def run_argv(argv: Sequence[str]) -> int:
    from ..convert.cli import main as convert_main

    return int(convert_main(list(argv)))
