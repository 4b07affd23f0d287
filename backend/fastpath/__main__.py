"""``python -m fastpath`` runs the CLI."""

import sys

from fastpath.cli import run

sys.exit(run())
