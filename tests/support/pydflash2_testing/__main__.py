"""`python -m pydflash2_testing DIR`: writes the demo files (a tiny target and drafters) into DIR."""

from . import main

raise SystemExit(main())
