"""Puts tests/support on sys.path, so that a benchmark run as `python benchmarks/X.py` can import
the test fixtures and benchmark helpers of `pydflash2_testing`, which stay out of the wheel."""

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
