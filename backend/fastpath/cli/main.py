"""The ``fastpath`` command line.

    fastpath serve [--model NAME ...]          run tritonserver on the model repository (what `make serve` runs)
    fastpath build [--if-missing] [--int8]     build versioned model artifacts
    fastpath swap | rollback | status          live model-version control
    fastpath bench --model M ...               the SDK's Python load generator (served figures: perf_analyzer)

Ports default to the environment variables HTTP_PORT, GRPC_PORT and METRICS_PORT, then to Triton's
8000, 8001 and 8002; swap, rollback, status and bench go by default to those ports on $HOST (the
address `make serve HOST=...` binds; localhost when unset or 0.0.0.0), so with the same environment
they reach the server `make serve` started. --url HOST:PORT names another.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from fastpath.cli import admin, bench, build, serve
from fastpath.cli.common import plain_help


def build_parser() -> argparse.ArgumentParser:
    """The ``fastpath`` parser with every command registered."""
    parser = argparse.ArgumentParser(prog="fastpath", description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (build, serve, bench, admin):
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``fastpath`` command; returns its exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fastpath %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader of our stdout went away (`fastpath status | head`): stop quietly, as Unix tools do.
        # Python's documented recipe (library/signal.html, "Note on SIGPIPE"): point stdout at devnull
        # so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
    except KeyboardInterrupt:
        # Ctrl-C before a command installed its own handling (e.g. `fastpath serve` while it imports): one line, no traceback
        # (a swap or rollback the server has received completes there: its result is what `status` shows)
        after = " (the server may have made the change already: `fastpath status` shows the version it serves)"
        print(f"fastpath {args.command}: interrupted{after if args.command in ('swap', 'rollback') else ''}", file=sys.stderr)
        return 130  # 128 + SIGINT


if __name__ == "__main__":
    sys.exit(main())
