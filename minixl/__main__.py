"""`python -m minixl`: the command line (hand-written)."""

import sys

from .cli import main

sys.exit(main())
