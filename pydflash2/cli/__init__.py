"""The `pydflash2` command: one module per subcommand, each with
`register(subparsers)` (its arguments) and `run(args) -> int`."""

from __future__ import annotations

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
        return int(args.run(args))
    except CliError as e:
        print(f"pydflash2 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
