"""`python -m pydflash2.convert`."""

import sys

from .cli import main

sys.exit(main())
