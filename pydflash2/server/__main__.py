"""python -m pydflash2.server [--model T.gguf] [--draft D.gguf] [--port 8000] [--parallel N] ..."""

import sys

from ..cli.serve import main

sys.exit(main())
