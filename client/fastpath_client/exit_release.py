"""Shared-memory regions of clients never closed, released when the process exits.

A script that ends without ``close()`` (or ``with``) left each of its client's regions in ``/dev/shm`` and registered
at the server until Triton stopped. Every client is tracked here (weakly); at interpreter exit each one's idle and
pending regions are unregistered at the server and unlinked, 2 s per call at most. HTTP goes through urllib: tritonclient's
HTTP client (geventhttpclient) cannot start while the interpreter exits. A process killed by a signal cannot do this.
"""

from __future__ import annotations

import atexit
import contextlib
import urllib.request
import weakref
from typing import Any

_OPEN_CLIENTS: weakref.WeakSet = weakref.WeakSet()
CALL_TIMEOUT_S = 2.0


def track(client: Any) -> None:
    """Release ``client``'s regions at exit unless it was closed (closing empties its pool: nothing is left to do)."""
    _OPEN_CLIENTS.add(client)


def release(client: Any) -> None:
    """Unregister and unlink what ``client.close()`` would have: its idle regions and those pending unregistration."""
    regions = client._pool.drain()
    names = [region.name for region in regions] + client._take_pending()
    for name in names:
        with contextlib.suppress(Exception):  # the server may be gone: the files go regardless
            _unregister(client, name)
    for region in regions:
        region.destroy()


def _unregister(client: Any, name: str) -> None:
    if client.protocol == "http":
        url = f"http://{client.url}/v2/systemsharedmemory/region/{name}/unregister"
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=CALL_TIMEOUT_S):
            return
    triton = client._module.InferenceServerClient(client.url)
    try:
        triton.unregister_system_shared_memory(name, client_timeout=CALL_TIMEOUT_S)
    finally:
        triton.close()


@atexit.register
def _release_open_clients() -> None:
    for client in list(_OPEN_CLIENTS):
        with contextlib.suppress(Exception):
            release(client)
