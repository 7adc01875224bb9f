"""`python -m flashfleet.classify ...`: the same as the flashfleet-classify console script."""

import sys

from .cli import main

sys.exit(main())
