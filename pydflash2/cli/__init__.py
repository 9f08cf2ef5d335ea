"""The `pydflash2` command: one module per subcommand, each with
`register(subparsers)` (its arguments) and `run(args) -> int`."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from . import bench, convert, generate, info, modelfile, random_drafter, serve, train
from .common import CliError, Parser

SUBCOMMANDS = (info, convert, generate, bench, random_drafter, modelfile, serve, train)


def build_parser() -> Parser:
    parser = Parser(prog="pydflash2", description="DFlash2 speculative decoding for llama.cpp / GGUF models")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `convert` owns its arguments (it is also reachable as python -m pydflash2.convert)
    if argv and argv[0] == convert.NAME:
        return convert.run_argv(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        status = int(args.run(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
        return status
    except CliError as e:
        print(f"pydflash2 {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`pydflash2 generate ... | head -1`): stop quietly, as Python's docs
        # on SIGPIPE advise: stdout onto devnull, so that the flush at exit cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
