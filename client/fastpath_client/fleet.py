"""Rolling model-version swaps across a fleet of FastPath replicas.

One replica at a time: swap it (the server answers only after its instances loaded, warmed and
validated the version and flipped), check it is ready and serves the new version, then move on.
The first failure stops the roll and swaps every replica already moved back to the version it
served before, so the fleet never stays split between versions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

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
                 client_factory: Callable[[str], Client] | None = None, ready_timeout_s: float = 120.0) -> FleetSwapResult:
    """Swap ``model`` to ``version`` on each replica in turn; on the first failure, put all back.

    Args:
        urls: replica endpoints ``HOST:PORT`` (HTTP or gRPC ports as ``protocol`` says), in roll order.
        model: the model name, e.g. ``text_embedding``.
        version: the version to serve.
        protocol: ``http`` or ``grpc``.
        client_factory: url -> Client (default: ``Client(url, protocol)``, key from FASTPATH_ADMIN_KEY).
        ready_timeout_s: how long to wait for a replica to be ready before and after its swap.

    Returns:
        A :class:`FleetSwapResult`; ``ok`` False names the failing replica and the rollback done.
    """
    factory = client_factory or (lambda url: Client(url, protocol=protocol))
    clients = {url: factory(url) for url in urls}
    result = FleetSwapResult(ok=False, version=int(version), swapped=[], previous={})
    try:
        for url in urls:
            client = clients[url]
            try:
                client.wait_ready(timeout_s=ready_timeout_s, models=[model])
                result.previous[url] = _active_version(client.status(model), url)
                reply = client.swap(model, version)
                if _active_version(reply, url) != version:
                    raise ServerError(f"{url}: swap answered but serves version {reply.get('active_version')}")
                client.wait_ready(timeout_s=ready_timeout_s, models=[model])
                result.swapped.append(url)
            except FastPathClientError as exc:
                result.failed = (url, str(exc))
                break
        else:
            result.ok = True
            return result
        for url in reversed(result.swapped):
            if result.previous[url] != version:
                clients[url].swap(model, result.previous[url])
            result.rolled_back.append(url)
        return result
    finally:
        for client in clients.values():
            client.close()
