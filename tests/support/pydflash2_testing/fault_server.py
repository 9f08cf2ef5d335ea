"""python -m pydflash2_testing.fault_server [the options of `python -m pydflash2.server`]: the server
with the test-only fault injection hooks (faults.py) at its step loop's fault points, driven by
the trigger file PYDFLASH2_FAULT_INJECT names. For tests only (tests/server_process.py starts it
when a test passes that variable)."""

from __future__ import annotations

import sys

from pydflash2.cli.common import CliError, Parser
from pydflash2.cli.serve import add_serve_args, run

from .faults import ENV, FaultInjector


def main() -> int:
    parser = Parser(prog="python -m pydflash2_testing.fault_server", description=__doc__)
    add_serve_args(parser)
    args = parser.parse_args()
    hooks = FaultInjector.from_env()
    if hooks is None:
        print(f"fault_server: {ENV} must name a trigger file", file=sys.stderr)
        return 2
    try:
        return run(args, hooks=hooks)
    except CliError as e:
        print(f"pydflash2 serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
