"""python -m fusebox: the command line (fusebox.cli)."""

import sys

from .cli import main

sys.exit(main())
