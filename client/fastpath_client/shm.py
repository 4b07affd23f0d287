"""Large input tensors through POSIX system shared memory (``tritonclient.utils.shared_memory``).

When client and server share a host, a request's large inputs are copied once into a region under
``/dev/shm`` that Triton maps, instead of being serialized into the HTTP body or gRPC message. The
lifecycle of a region is one request: create and fill, register with the server, infer, unregister,
unlink, always in ``finally`` blocks, so no region outlives its call on either side. Region names start
with :data:`REGION_PREFIX` followed by the process id, so leaks are easy to find (and tests look).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import os
import socket
import threading
from collections.abc import Sequence
from typing import Literal

import numpy as np
import tritonclient.utils.shared_memory as tshm

from fastpath_client.errors import InvalidInputError

REGION_PREFIX = "fastpath_client_"
ALIGN_BYTES = 64
SharedMemoryMode = Literal["auto", "always", "never"]
_counter = itertools.count()
_counter_lock = threading.Lock()


def is_local_url(url: str) -> bool:
    """True when ``url`` (``host:port``) names this machine: loopback addresses, ``localhost`` or this host's name."""
    if url.startswith("["):
        host = url[1 : url.find("]")]
    else:
        host = url.rsplit(":", 1)[0] if url.count(":") == 1 else url
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedMemoryPolicy:
    """Which inputs go through system shared memory.

    Attributes:
        mode: "auto" (server on this host and input >= ``threshold_bytes``), "always" (every non-BYTES
            input; fails if the server cannot map the region) or "never".
        threshold_bytes: size from which an input counts as large in "auto" mode (default 1 MiB).
    """

    mode: SharedMemoryMode = "auto"
    threshold_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "always", "never"):
            raise InvalidInputError(f"shared_memory must be 'auto', 'always' or 'never', got {self.mode!r}")

    def selects(self, array: np.ndarray, datatype: str, *, local: bool) -> bool:
        """Whether this input goes through shared memory (BYTES tensors never do)."""
        if self.mode == "never" or datatype == "BYTES":
            return False
        if self.mode == "always":
            return True
        return local and array.nbytes >= self.threshold_bytes


@dataclasses.dataclass
class InputRegion:
    """One system shared-memory region holding some inputs of one request.

    Attributes:
        name: the region's name on the server (``register_system_shared_memory``).
        key: the POSIX shm key (``/dev/shm/<key>``).
        byte_size: region size in bytes.
        offsets: byte offset of each array, in the order given to :func:`create_region`.
    """

    name: str
    key: str
    byte_size: int
    offsets: list[int]
    handle: object

    def destroy(self) -> None:
        """Unmap and unlink the region (idempotent)."""
        if self.handle is not None:
            handle, self.handle = self.handle, None
            tshm.destroy_shared_memory_region(handle)


def create_region(arrays: Sequence[np.ndarray]) -> InputRegion:
    """Create a region large enough for ``arrays`` (each 64-byte aligned) and copy them in.

    Raises:
        tritonclient.utils.shared_memory.SharedMemoryException: ``/dev/shm`` refused the region.
    """
    offsets, total = [], 0
    for array in arrays:
        offsets.append(total)
        total += -(-array.nbytes // ALIGN_BYTES) * ALIGN_BYTES
    with _counter_lock:
        name = f"{REGION_PREFIX}{os.getpid()}_{next(_counter)}"
    handle = tshm.create_shared_memory_region(name, name, max(total, ALIGN_BYTES), create_only=True)
    region = InputRegion(name=name, key=name, byte_size=max(total, ALIGN_BYTES), offsets=offsets, handle=handle)
    try:
        for array, offset in zip(arrays, offsets):
            tshm.set_shared_memory_region(handle, [array], offset=offset)
    except BaseException:
        region.destroy()
        raise
    return region


def leaked_regions(pid: int | None = None) -> list[str]:
    """Names under ``/dev/shm`` created by this module (for process ``pid``, default: any)."""
    prefix = REGION_PREFIX + (f"{pid}_" if pid is not None else "")
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []
