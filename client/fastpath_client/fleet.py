"""Rolling model-version swaps across a fleet of FastPath replicas.

First every replica is checked (ready, and its active version read) before any is swapped, so a
replica that is down stops the roll with nothing moved. Then one replica at a time: swap it (the
server answers only after its instances loaded, warmed and validated the version and flipped),
check it is ready and serves the new version, then move on. The first failure, or an interrupt
(Ctrl-C, or SIGTERM where the caller turns it into an exception as the CLI does), stops the roll
and swaps every replica already moved, and the one in flight, back to the version it served
before, so the fleet never stays split between versions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fastpath_client.checks import distinct_replicas, model_version
from fastpath_client.client import Client
from fastpath_client.errors import FastPathClientError, ServerError


@dataclasses.dataclass
class FleetSwapResult:
    """What a rolling swap did.

    Attributes:
        ok: every replica serves ``version``.
        swapped: replicas moved to ``version`` (and, when not ok, moved back).
        previous: replica url -> the version it served before the roll.
        failed: (url, message) of the replica that failed, or None.
        rolled_back: replicas returned to their previous version after the failure.
    """

    ok: bool
    version: int
    swapped: list[str]
    previous: dict[str, int]
    failed: tuple[str, str] | None = None
    rolled_back: list[str] = dataclasses.field(default_factory=list)


def _active_version(reply: dict[str, Any], url: str) -> int:
    version = reply.get("active_version")
    if version is None:
        raise ServerError(f"{url}: instances disagree on the active version: {reply.get('active_versions')}")
    return int(version)


def rolling_swap(urls: Sequence[str], model: str, version: int, *, protocol: str = "http",
                 client_factory: Callable[[str], Client] | None = None, ready_timeout_s: float = 120.0,
                 on_progress: Callable[[str], None] | None = None) -> FleetSwapResult:
    """Swap ``model`` to ``version`` on each replica in turn; on the first failure, put all back.

    Args:
        urls: replica endpoints ``HOST:PORT`` (HTTP or gRPC ports as ``protocol`` says), in roll order.
        model: the model name, e.g. ``text_embedding``.
        version: the version to serve.
        protocol: ``http`` or ``grpc``.
        client_factory: url -> Client (default: ``Client(url, protocol)``, key from FASTPATH_ADMIN_KEY).
        ready_timeout_s: how long to wait for a replica to be ready before and after its swap.
        on_progress: called with a line per step (checked, swapping, swapped, rolling back).

    Returns:
        A :class:`FleetSwapResult`; ``ok`` False names the failing replica and the rollback done
        (``swapped`` empty when the check before the roll failed).

    Raises:
        InvalidInputError: a malformed url, or one replica named twice (:func:`~fastpath_client.checks.distinct_replicas`),
            before any replica is touched.
        BaseException: an interrupt (KeyboardInterrupt, or what a signal handler raised) during the
            roll, re-raised after the replicas already moved were swapped back.
    """
    distinct_replicas(urls)
    say = on_progress or (lambda line: None)
    factory = client_factory or (lambda url: Client(url, protocol=protocol))
    clients = {url: factory(url) for url in urls}
    result = FleetSwapResult(ok=False, version=model_version(version), swapped=[], previous={})
    try:
        if not _all_ready(clients, model, ready_timeout_s, result, say):
            return result
        in_flight = None
        try:
            for url in urls:
                in_flight = url
                say(f"{url}: swapping to version {version}")
                try:
                    _swap_one(clients[url], url, model, version, ready_timeout_s)
                except FastPathClientError as exc:
                    result.failed = (url, str(exc))
                    say(f"{url}: failed: {exc}")
                    break
                result.swapped.append(url)
                in_flight = None
                say(f"{url}: serving version {version}")
            else:
                result.ok = True
                return result
        except BaseException:  # an interrupt: put back what moved, and the replica in flight, then re-raise
            _roll_back(clients, result, model, [*result.swapped, *([in_flight] if in_flight else [])], say)
            raise
        _roll_back(clients, result, model, result.swapped, say)
        return result
    finally:
        for client in clients.values():
            client.close()


def _all_ready(clients: dict[str, Client], model: str, ready_timeout_s: float, result: FleetSwapResult,
               say: Callable[[str], None]) -> bool:
    """Every replica ready, its active version in ``result.previous``; else False with ``result.failed`` set,
    before any replica moved."""
    for url, client in clients.items():
        say(f"{url}: checking that {model} is ready (up to {ready_timeout_s:g} s)")
        try:
            client.wait_ready(timeout_s=ready_timeout_s, models=[model])
            result.previous[url] = _active_version(client.status(model), url)
        except FastPathClientError as exc:
            result.failed = (url, str(exc))
            say(f"{url}: not ready, nothing swapped: {exc}")
            return False
        say(f"{url}: ready, serving version {result.previous[url]}")
    return True


def _swap_one(client: Client, url: str, model: str, version: int, ready_timeout_s: float) -> None:
    reply = client.swap(model, version)
    if _active_version(reply, url) != version:
        raise ServerError(f"{url}: swap answered but serves version {reply.get('active_version')}")
    client.wait_ready(timeout_s=ready_timeout_s, models=[model])


def _roll_back(clients: dict[str, Client], result: FleetSwapResult, model: str, urls: Sequence[str],
               say: Callable[[str], None]) -> None:
    """Swap each of ``urls`` (latest first) back to its previous version, unless that is ``result.version``.

    A replica whose swap the client stopped waiting for (an interrupt) may still be applying it: its swap
    back is posted after it, and the server's instances apply swap commands in order, so the replica ends
    on its previous version either way.
    """
    for url in reversed(urls):
        previous = result.previous[url]
        if previous != result.version:
            say(f"{url}: rolling back to version {previous}")
            clients[url].swap(model, previous)
        result.rolled_back.append(url)
