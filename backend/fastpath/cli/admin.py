"""``fastpath swap | rollback | status``: live model-version control from the command line.

Each takes ``--url HOST:PORT`` (repeatable or comma-separated: several replicas make ``swap`` a
rolling swap, one replica at a time, all rolled back on the first failure; default: the server `make
serve` started with this environment: $HOST and $HTTP_PORT) and ``--protocol
http|grpc``. The admin key comes from ``FASTPATH_ADMIN_KEY``, else from the file `fastpath serve`
wrote for that URL's port when it generated one (``~/.cache/fastpath/admin_key.<port>``), else the
latest it wrote (``admin_key``). Output is the server's JSON reply; the exit code is 0 on success, 1
(one line on stderr) on failure, e.g. ``status`` of a model with no live instances (not loaded).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from fastpath.cli.common import URL_DEFAULT, plain_help
from fastpath.errors import NotLoadedError


def _key(url: str) -> str | None:
    """FASTPATH_ADMIN_KEY, else the key `fastpath serve` wrote for ``url``'s port, else the latest it wrote."""
    from fastpath.server.triton_api import find_admin_key

    return find_admin_key(url.rsplit(":", 1)[-1] if ":" in url else None)


def _urls(values: list[str] | None, protocol: str = "http") -> list[str]:
    """The ``--url`` values split at commas; without any, :func:`~fastpath.cli.common.default_url`."""
    from fastpath.cli.common import default_url

    return [u.strip() for value in (values or [default_url(protocol)]) for u in value.split(",") if u.strip()]


def _status(client: Any, model: str) -> dict[str, Any]:
    """``client.status(model)``, refused like ``swap`` refuses it when the model has no live instances.

    Raises:
        NotLoadedError: the reply lists no instance (neither one with live swaps nor one publishing
            its progress): the model is not loaded at the client's URL (its readiness endpoint says
            not ready), or it is loaded but is not a FastPath model.
    """
    reply = client.status(model)
    if reply.get("instances") or reply.get("progress"):
        return reply
    last = (reply.get("recoveries") or [{}])[-1]
    if last.get("outcome") == "reloading":
        since = time.strftime("%H:%M:%S", time.localtime(float(last.get("at", 0))))
        raise NotLoadedError(f"model {model} at {client.url} is being reloaded: its python-backend stub (pid {last.get('pid')}) "
                             f"{last.get('cause')} at {since} and `fastpath serve` reloads the model (about 5-9 s); retry then")
    if client.ready(model):
        raise NotLoadedError(f"model {model} at {client.url} has no live FastPath instances: it is loaded, but its stub may "
                             "have just died (`fastpath serve` reloads the model within seconds: retry), or it is not a "
                             "FastPath model with live swaps or a progress record (text_embedding and text_detection are)")
    raise NotLoadedError(f"model {model} is not loaded at {client.url}: it has no live FastPath instances "
                         f"(`fastpath serve --model {model}` loads it; only FastPath models, such as text_embedding "
                         "and text_detection, have instances to report)")


def _run(args: argparse.Namespace) -> int:
    from fastpath.cli.common import error_line, quiet_gevent_interrupts
    from fastpath_client import Client, FastPathClientError, InvalidInputError
    from fastpath_client.checks import distinct_replicas

    if args.protocol == "http":
        quiet_gevent_interrupts()
    urls = _urls(args.url, args.protocol)
    try:
        if not urls:
            raise InvalidInputError(f"--url {','.join(args.url or [])!r} names no replica; expected HOST:PORT, comma-separated for a fleet")
        if args.command == "swap" and len(urls) > 1:
            return _rolling_swap(args, urls)  # the SDK's rolling_swap checks the replicas are distinct first
        distinct_replicas(urls)  # every address checked before any replica is touched
        if args.command == "rollback" and len(urls) > 1:
            return _fleet_rollback(args, urls)
        replies: dict[str, Any] = {}
        for url in urls:
            with Client(url, protocol=args.protocol, admin_key=_key(url)) as client:
                if args.command == "swap":
                    replies[url] = client.swap(args.model, args.version)
                elif args.command == "rollback":
                    replies[url] = client.rollback(args.model)
                else:
                    replies[url] = _status(client, args.model)
        print(json.dumps(replies[urls[0]] if len(urls) == 1 else replies, indent=2))
        return 0
    except NotLoadedError as exc:
        print(f"fastpath {args.command}: {exc}", file=sys.stderr)
        return 1
    except FastPathClientError as exc:
        print(f"fastpath {args.command}: {error_line(exc, args.protocol, url_given=bool(args.url))}", file=sys.stderr)
        return 1


def _rolling_swap(args: argparse.Namespace, urls: list[str]) -> int:
    """``fastpath swap`` over several replicas: progress on stderr, the result as JSON on stdout. SIGTERM is
    turned into KeyboardInterrupt for the roll, so Ctrl-C and SIGTERM alike swap back what moved (exit 130)."""
    from fastpath_client import Client
    from fastpath_client.fleet import rolling_swap

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        result = rolling_swap(urls, args.model, args.version, protocol=args.protocol,
                              client_factory=lambda url: Client(url, protocol=args.protocol, admin_key=_key(url)),
                              on_progress=lambda line: print(f"fastpath swap: {line}", file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print("fastpath swap: interrupted; the replicas already swapped were swapped back", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(result.__dict__, indent=2))
    return 0 if result.ok else 1


def _fleet_rollback(args: argparse.Namespace, urls: list[str]) -> int:
    """``fastpath rollback`` over several replicas: every replica's status is read first (reachable, the model
    live; when one fails, nothing is rolled back), then each is rolled back in turn.
    A failure part-way stops there and says which replicas were rolled back and which were not attempted, as
    JSON on stdout (``rolled_back``: url -> reply, ``failed``: url -> error, ``not_attempted``); exit 1."""
    from fastpath.cli.common import error_line
    from fastpath_client import Client, FastPathClientError

    def line(exc: Exception) -> str:
        return error_line(exc, args.protocol, url_given=True) if isinstance(exc, FastPathClientError) else str(exc)

    def say(text: str) -> None:  # each replica's steps on stderr, as a rolling swap reports them
        print(f"fastpath rollback: {text}", file=sys.stderr, flush=True)

    for url in urls:
        try:
            with Client(url, protocol=args.protocol, admin_key=_key(url)) as client:
                serving = _status(client, args.model).get("active_versions")
        except (FastPathClientError, NotLoadedError) as exc:
            say(f"{url}: {line(exc)}; nothing rolled back")
            return 1
        say(f"{url}: ready, serving version {_versions(serving)}")
    done: dict[str, Any] = {}
    for index, url in enumerate(urls):
        say(f"{url}: rolling back")
        try:
            with Client(url, protocol=args.protocol, admin_key=_key(url)) as client:
                done[url] = client.rollback(args.model)
            say(f"{url}: serving version {_versions(done[url].get('active_versions'))}")
        except (FastPathClientError, NotLoadedError) as exc:
            print(f"fastpath rollback: {url}: {line(exc)}; rolled back before it: {list(done) or 'none'}", file=sys.stderr)
            print(json.dumps({"rolled_back": done, "failed": {url: line(exc)}, "not_attempted": urls[index + 1:]}, indent=2))
            return 1
    print(json.dumps(done, indent=2))
    return 0


def _versions(active: Any) -> str:
    """A reply's ``active_versions`` as a progress line says it: ``2``, or ``1, 2`` mid-change (``?`` when absent)."""
    return ", ".join(str(version) for version in active) if active else "?"


def register(subparsers: Any) -> None:
    """Add the swap, rollback and status subcommands."""
    helps = {
        "swap": "serve VERSION of MODEL, live (load, warm, validate, flip; the old version keeps serving on failure)",
        "rollback": "go back to the version served before the last swap",
        "status": "active version, standby, state, last error and liveness of MODEL's instances, and its reloads",
    }
    for command, text in helps.items():
        parser = subparsers.add_parser(command, help=text, description=text + ". " + plain_help(__doc__).split("\n\n")[1])
        parser.add_argument("model", help="model name, e.g. text_embedding")
        if command == "swap":
            parser.add_argument("version", type=int, help="version directory number in the model repository")
        parser.add_argument("--url", action="append", help=f"HOST:PORT of a replica; repeat or comma-separate for a fleet. {URL_DEFAULT}")
        parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
        parser.set_defaults(func=_run, command=command)
