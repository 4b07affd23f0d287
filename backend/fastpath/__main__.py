"""``python -m fastpath`` runs the CLI."""

import sys

from fastpath.cli.main import main

sys.exit(main())
