"""The ``fastpath`` command: ``serve``, ``build``, ``swap``/``rollback``/``status`` and ``bench`` (``fastpath.cli.main.main``).

:func:`run` is the console script: light to import, so that a Ctrl-C at any moment, even while the CLI's modules
import, ends with one line and exit 130.
"""

from __future__ import annotations

import signal
import sys


def run() -> int:
    """The ``fastpath`` console script: :func:`fastpath.cli.main.main` with Ctrl-C handled from the first import on.

    Returns the command's exit code; 130 (128 + SIGINT) and one line on stderr for a Ctrl-C before the command's
    own handling (``main`` names the command once its arguments are parsed). Once the command has returned, SIGINT
    is ignored: a Ctrl-C while the interpreter closes the command's connections cannot turn its result (its JSON
    already printed) into a failure.
    """
    try:
        from fastpath.cli.main import main

        code = main()
    except KeyboardInterrupt:
        print("fastpath: interrupted", file=sys.stderr)
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code
