"""What a serving text-embedding instance holds for live swaps: slots + agent, in one object."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from fastpath.artifacts.manifest import ChecksumCache, verify_manifest
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.golden import check_engine_io, load_text_version, validate_text_version
from fastpath.models.text_embedding.pipeline import TextEmbedder
from fastpath.swaps.agent import SwapAgent
from fastpath.swaps.control import ControlPlane, state_dir
from fastpath.swaps.slots import EngineSlots

LOG = logging.getLogger(__name__)
BACKGROUND_NICE = 10  # nice value of the pre-verification thread: serving threads stay at the process's own


def lower_thread_priority(increment: int = BACKGROUND_NICE) -> None:
    """Make the calling thread (only it: Linux keeps a nice value per thread) yield the CPU to serving.

    Threads this thread starts afterwards inherit the value, and an unprivileged process cannot
    raise it back, so call it only in threads that start none (no ONNX Runtime session is made there).
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + increment)
    except (OSError, AttributeError) as exc:  # not Linux, or a sandbox that forbids it: run at normal priority
        LOG.debug("could not lower the priority of %s: %s", threading.current_thread().name, exc)


def release_freed_memory() -> None:
    """Return freed heap pages to the OS after an engine is released (glibc ``malloc_trim``), so the
    stub's RSS goes back to its baseline after a swap instead of keeping the old engine's arenas."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


class VersionedEmbedder:
    """The active/standby text embedders of one model instance, swapped by the control plane.

    The initial version is loaded as the version directory Triton gave the model (no golden gate:
    Triton itself chose it); later versions must pass :func:`validate_text_version`.

    Args:
        model_dir: the model's directory in the model repository.
        version: the version Triton loaded.
        config: parsed config.pbtxt parameters.
        instance: Triton's ``model_instance_name`` (names this instance in the control plane).
        model_name: the Triton model name.
    """

    def __init__(self, model_dir: Path, version: int, config: TextEmbeddingConfig, *, instance: str, model_name: str) -> None:
        self.model_dir, self.config = Path(model_dir), config
        self.initial = TextEmbedder.from_directory(self.model_dir / str(version), config)
        check_engine_io(self.initial)
        self.initial.check_lanes()  # warms each engine lane and checks it against the main session, as swaps do
        self.checksums = ChecksumCache()
        self._tokenizer_sha256 = self.checksums.sha256(self.model_dir / str(version) / config.tokenizer)
        self.stages_s: dict[str, float] = {}  # the last swap's stages (seconds), reported with the status
        self.slots: EngineSlots[TextEmbedder] = EngineSlots(version, self.initial, on_release=release_freed_memory)
        plane = ControlPlane(state_dir(self.model_dir.parent), model_name)
        self.agent = SwapAgent(plane, instance, self.slots, self._load, self._validate, details=self._details).start()
        self._stop = threading.Event()
        self._preverifier = threading.Thread(target=self._preverify, name=f"fastpath-verify-{instance}", daemon=True)
        self._preverifier.start()

    def _preverify(self) -> None:
        """Hash every version's files once, at low priority, so a swap finds its checksums cached.

        A failure here only logs: the swap verifies again and refuses with the reason.
        """
        lower_thread_priority()
        for version_dir in sorted(p for p in self.model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            if self._stop.is_set():
                return
            try:
                verify_manifest(version_dir, checksums=self.checksums)
            except Exception as exc:  # an unbuilt or broken version must not stop the others being verified
                LOG.info("pre-verification of %s: %s", version_dir, exc)

    def _details(self) -> dict[str, Any]:
        return {"last_swap_stages_s": {name: round(seconds, 4) for name, seconds in self.stages_s.items()}}

    def _load(self, version: int) -> TextEmbedder:
        self.stages_s = {}
        return load_text_version(self.model_dir, version, self.config, checksums=self.checksums, timings=self.stages_s,
                                 serving_tokenizer=(self.initial.tokenizer, self._tokenizer_sha256))

    def _validate(self, embedder: TextEmbedder, version: int) -> None:
        started = time.perf_counter()
        validate_text_version(embedder, self.model_dir / str(version), checksums_verified=True)
        self.stages_s["golden_s"] = time.perf_counter() - started

    def lease(self) -> contextlib.AbstractContextManager[tuple[TextEmbedder, int]]:
        """(embedder, version) of the active slot, held for one batch (a context manager)."""
        return self.slots.lease()

    def close(self) -> None:
        """Stop the agent and the pre-verification, release every slot (idempotent)."""
        self._stop.set()
        self.agent.stop()
        self.slots.close()
