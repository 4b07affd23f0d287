"""Shared-memory regions of clients never closed, released when the process exits.

A script that ends without ``close()`` (or ``with``) left each of its client's regions in ``/dev/shm`` and registered
at the server until Triton stopped. Each client hands :func:`track` its own release step (held weakly: a client that is
garbage-collected drops out); at interpreter exit each one unregisters its idle and pending regions at the server
through :func:`release` and unlinks them, 2 s per call at most. HTTP goes through urllib: tritonclient's HTTP client
(geventhttpclient) cannot start while the interpreter exits. A process killed by a signal cannot do this.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from typing import Any

_RELEASES: list[weakref.WeakMethod] = []
_LOCK = threading.Lock()
CALL_TIMEOUT_S = 2.0


def track(release_step: Callable[[], None]) -> None:
    """Run ``release_step`` (a client's bound method) at exit while its client lives; a closed client's does nothing."""
    with _LOCK:
        _RELEASES[:] = [ref for ref in _RELEASES if ref() is not None]
        _RELEASES.append(weakref.WeakMethod(release_step))


def release(url: str, protocol: str, regions: Sequence[Any], pending: Sequence[str]) -> None:
    """Unregister ``regions`` (their ``name``) and the region names ``pending`` at the server at ``url`` over
    ``protocol`` (``http`` or ``grpc``), then destroy ``regions`` (unlink their files); a server that is gone or
    refuses is skipped, the files go regardless."""
    for name in [region.name for region in regions] + list(pending):
        with contextlib.suppress(Exception):
            _unregister(url, protocol, name)
    for region in regions:
        region.destroy()


def _unregister(url: str, protocol: str, name: str) -> None:
    if protocol == "http":
        request = urllib.request.Request(f"http://{url}/v2/systemsharedmemory/region/{name}/unregister", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S):
            return
    import tritonclient.grpc as grpcclient

    triton = grpcclient.InferenceServerClient(url)
    try:
        triton.unregister_system_shared_memory(name, client_timeout=CALL_TIMEOUT_S)
    finally:
        triton.close()


@atexit.register
def _release_open_clients() -> None:
    with _LOCK:
        steps = [ref() for ref in _RELEASES]
    for step in steps:
        if step is not None:
            with contextlib.suppress(Exception):
                step()
