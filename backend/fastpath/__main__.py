"""``python -m fastpath`` runs the CLI."""

import sys

from fastpath.cli import main

sys.exit(main())
