"""`python -m minixl.experiments NAME [options]`: run one entry of the registry of runs."""

import sys

from . import main

sys.exit(main())
