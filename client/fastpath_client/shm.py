"""Large input tensors through POSIX system shared memory (``tritonclient.utils.shared_memory``).

When client and server share a host, a request's large inputs are copied once into a region under
``/dev/shm`` that Triton maps, instead of being serialized into the HTTP body or gRPC message. The
client keeps registered regions in a :class:`RegionPool` and reuses them, so a request costs one copy
into memory Triton has already mapped. A region whose request failed (a timeout: Triton may still be
reading it) is never reused: it is unregistered (later, if Triton says it is still in use) and unlinked.
``close()`` unregisters and unlinks every region. Region names start with :data:`REGION_PREFIX` and the
process id, so leaks are easy to find (and tests look).
"""

from __future__ import annotations

import dataclasses
import inspect
import ipaddress
import itertools
import os
import socket
import threading
import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np

with warnings.catch_warnings():  # tritonclient 2.51 imports pkg_resources, whose deprecation notice every CLI command printed
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    import tritonclient.utils.shared_memory as tshm

from fastpath_client.checks import host_port
from fastpath_client.errors import InvalidInputError

REGION_PREFIX = "fastpath_client_"
ALIGN_BYTES = 64
MIN_REGION_BYTES = 64 << 10
SharedMemoryMode = Literal["auto", "always", "never"]
_counter = itertools.count()
_counter_lock = threading.Lock()
# newer tritonclient releases can refuse a name that already exists (create_only); 2.51 opens it. Names here hold this
# process's id and a counter, so only a dead process's leftover could exist, and 2.51 resizes that one for reuse.
_CREATE_ONLY = {"create_only": True} if "create_only" in inspect.signature(tshm.create_shared_memory_region).parameters else {}


def is_local_url(url: str) -> bool:
    """True when ``url`` (``host:port``) names this machine: loopback addresses, ``localhost`` or this host's name.

    Raises:
        InvalidInputError: ``url`` is not ``host:port`` (:func:`~fastpath_client.checks.host_port`).
    """
    host = host_port(url)[0]
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


def packed_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Bytes ``arrays`` take in a region, each starting at a 64-byte aligned offset."""
    return sum(-(-array.nbytes // ALIGN_BYTES) * ALIGN_BYTES for array in arrays)


def size_class(byte_size: int) -> int:
    """Region size for ``byte_size``: the next power of two, at least 64 KiB, so regions can be reused.
    (tmpfs allocates pages on first touch, so the unused tail of a region costs no memory.)"""
    return max(MIN_REGION_BYTES, 1 << max(byte_size - 1, 1).bit_length())


@dataclasses.dataclass
class InputRegion:
    """One system shared-memory region that carries the large inputs of one request at a time.

    Attributes:
        name: the region's name on the server (``register_system_shared_memory``).
        key: the POSIX shm key (``/dev/shm/<key>``).
        byte_size: region size in bytes.
        offsets: byte offset of each array of the last :meth:`write`.
    """

    name: str
    key: str
    byte_size: int
    handle: object
    offsets: list[int] = dataclasses.field(default_factory=list)

    def write(self, arrays: Sequence[np.ndarray]) -> None:
        """Copy ``arrays`` in at 64-byte aligned offsets (recorded in ``offsets``).

        Raises:
            ValueError: they do not fit.
        """
        if packed_bytes(arrays) > self.byte_size:
            raise ValueError(f"{packed_bytes(arrays)} bytes do not fit region {self.name} of {self.byte_size} bytes")
        self.offsets, offset = [], 0
        for array in arrays:
            tshm.set_shared_memory_region(self.handle, [array], offset=offset)
            self.offsets.append(offset)
            offset += -(-array.nbytes // ALIGN_BYTES) * ALIGN_BYTES

    def destroy(self) -> None:
        """Unmap and unlink the region (idempotent)."""
        if self.handle is not None:
            handle, self.handle = self.handle, None
            tshm.destroy_shared_memory_region(handle)


def new_region(byte_size: int) -> InputRegion:
    """Create an empty region of ``byte_size`` bytes under ``/dev/shm``, named after this process.

    Raises:
        tritonclient.utils.shared_memory.SharedMemoryException: ``/dev/shm`` refused the region.
    """
    with _counter_lock:
        name = f"{REGION_PREFIX}{os.getpid()}_{next(_counter)}"
    handle = tshm.create_shared_memory_region(name, name, byte_size, **_CREATE_ONLY)
    return InputRegion(name=name, key=name, byte_size=byte_size, handle=handle)


def create_region(arrays: Sequence[np.ndarray]) -> InputRegion:
    """A new region just large enough for ``arrays``, with them copied in."""
    region = new_region(max(packed_bytes(arrays), ALIGN_BYTES))
    try:
        region.write(arrays)
    except BaseException:
        region.destroy()
        raise
    return region


class RegionPool:
    """Registered regions kept between requests of one client, so a request costs one copy into an
    already-mapped region instead of create + register + unregister + unlink.

    Thread-safe. Each request holds its own region while it runs; idle regions beyond
    ``max_idle_bytes`` are handed back for unregistering and destroying.

    Args:
        max_idle_bytes: most bytes of idle regions kept (default 256 MiB).
    """

    def __init__(self, max_idle_bytes: int = 256 << 20) -> None:
        self.max_idle_bytes = max_idle_bytes
        self._idle: list[InputRegion] = []
        self._lock = threading.Lock()

    def take(self, byte_size: int) -> InputRegion | None:
        """The smallest idle region of at least ``byte_size`` bytes, or None."""
        with self._lock:
            fits = [r for r in self._idle if r.byte_size >= byte_size]
            if not fits:
                return None
            region = min(fits, key=lambda r: r.byte_size)
            self._idle.remove(region)
            return region

    def give(self, region: InputRegion) -> list[InputRegion]:
        """Return ``region`` after a successful request; returns the regions to release (oldest first)."""
        with self._lock:
            self._idle.append(region)
            evicted = []
            while sum(r.byte_size for r in self._idle) > self.max_idle_bytes:
                oldest = self._idle.pop(0)
                evicted.append(oldest)
            return evicted

    def drain(self) -> list[InputRegion]:
        """Every idle region, for release at close."""
        with self._lock:
            regions, self._idle = self._idle, []
            return regions


def leaked_regions(pid: int | None = None) -> list[str]:
    """Names under ``/dev/shm`` created by this module (for process ``pid``, default: any)."""
    prefix = REGION_PREFIX + (f"{pid}_" if pid is not None else "")
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []
