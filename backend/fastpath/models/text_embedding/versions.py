"""What a serving text-embedding instance holds for live swaps: slots + agent, in one object."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from fastpath.errors import VersionRecordError
from fastpath.manifest import ChecksumCache, read_manifest, verify_manifest
from fastpath.memory import release_freed_heap
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.golden import check_engine_io, load_text_version, validate_text_version, verify_loaded_files
from fastpath.models.text_embedding.pipeline import TextEmbedder
from fastpath.swaps.agent import SwapAgent
from fastpath.swaps.control import ControlPlane, instance_key, state_dir
from fastpath.swaps.record import VersionRecord, read_record, record_path
from fastpath.swaps.slots import EngineSlots

LOG = logging.getLogger(__name__)
# a restored version is an event Triton's log shows at INFO, as swaps are (fastpath.triton.logs.EVENT_LOGGERS)
RESTORE_LOG = logging.getLogger("fastpath.swaps.restore")
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


class VersionedEmbedder:
    """The active/standby text embedders of one model instance, swapped by the control plane.

    The version Triton loaded is loaded first, the files it loads verified against its manifest
    (``ArtifactError`` otherwise; no golden gate: Triton itself chose it). When the
    model's serving-version record (``fastpath.swaps.record``) names another version, that one is
    loaded and golden-checked like a swap and serves instead, so a reload or restart comes back on the
    version last swapped to; if it fails, the recorded previous version is tried, then Triton's, and
    the log and the status (``restore``) say why. A record that cannot be read is logged as an
    error and reported the same way; Triton's version then serves. Later versions must pass
    :func:`validate_text_version`.

    Args:
        model_dir: the model's directory in the model repository.
        version: the version Triton loaded.
        config: parsed config.pbtxt parameters.
        instance: Triton's ``model_instance_name`` (names this instance in the control plane).
        model_name: the Triton model name.
    """

    def __init__(self, model_dir: Path, version: int, config: TextEmbeddingConfig, *, instance: str, model_name: str) -> None:
        self.model_dir, self.config = Path(model_dir), config
        self.checksums = ChecksumCache()
        version_dir = self.model_dir / str(version)
        # the files this config loads must match the version's manifest, as a swap's must
        verify_loaded_files(version_dir, read_manifest(version_dir), config, checksums=self.checksums)
        self.initial = TextEmbedder.from_directory(version_dir, config)
        check_engine_io(self.initial)
        self.initial.check_lanes()  # warms each engine lane and checks it against the main session, as swaps do
        self._tokenizer_sha256 = self.checksums.sha256(self.model_dir / str(version) / config.tokenizer)
        self.stages_s: dict[str, float] = {}  # the last swap's stages (seconds), reported with the status
        self.record_path = record_path(self.model_dir)
        self.restore: dict[str, Any] | None = None  # what reading the record at load found (None: no record)
        record = self._read_record()
        active, serving = self._restore(version, record)
        # the recorded previous version is this one's only when the recorded version is the one serving
        previous = record.previous_version if record is not None and record.version == active else None
        self.slots: EngineSlots[TextEmbedder] = EngineSlots(active, self.initial, on_release=release_freed_heap,
                                                            previous_version=previous)
        plane = ControlPlane(state_dir(self.model_dir.parent), model_name)
        self.agent = SwapAgent(plane, instance_key(instance, os.getpid()), self.slots, self._load, self._validate, details=self._details,
                               record_path=self.record_path, record=record, serving=serving).start()
        self._stop = threading.Event()
        self._preverifier = threading.Thread(target=self._preverify, name=f"fastpath-verify-{instance}", daemon=True)
        self._preverifier.start()

    def _read_record(self) -> VersionRecord | None:
        try:
            return read_record(self.record_path)
        except VersionRecordError as exc:
            LOG.error("%s; serving the version Triton loaded until the next swap rewrites the record", exc)
            self.restore = {"version": None, "ok": False, "error": str(exc)}
            return None

    def _restore(self, loaded: int, record: VersionRecord | None) -> tuple[int, dict[str, Any]]:
        """Serve the recorded version when it differs from Triton's ``loaded`` one; returns
        (active version, how it came to serve) and leaves ``self.initial`` on that version."""
        serving = {"since": time.time(), "reason": "loaded"}
        if record is None or record.version == loaded:
            return loaded, ({"since": record.since, "reason": record.reason} if record else serving)
        errors = []
        for version in dict.fromkeys(v for v in (record.version, record.previous_version) if v not in (None, loaded)):
            try:
                embedder = self._load(version)
                try:
                    self._validate(embedder, version)
                except BaseException:
                    embedder.close()
                    raise
            except Exception as exc:  # a missing, corrupt or failing version: try the next one
                errors.append(f"version {version}: {exc}")
                LOG.error("%s: cannot restore version %s recorded in %s: %s", self.model_dir.name, version, self.record_path, exc)
                continue
            self.initial.close()
            self.initial = embedder
            self.restore = {"version": version, "ok": version == record.version, "error": "; ".join(errors) or None}
            recorded_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.since))
            if version == record.version:
                RESTORE_LOG.info("%s: serving version %s from %s (%s at %s)", self.model_dir.name, version,
                                 self.record_path, record.reason, recorded_at)
                return version, {"since": record.since, "reason": record.reason}
            LOG.error("%s: serving version %s, the previous version in %s, instead of version %s (%s at %s), which "
                      "cannot be restored", self.model_dir.name, version, self.record_path, record.version, record.reason, recorded_at)
            return version, serving
        self.restore = {"version": loaded, "ok": False, "error": "; ".join(errors)}
        LOG.error("%s: serving version %s, the one Triton loaded, instead of version %s recorded in %s",
                  self.model_dir.name, loaded, record.version, self.record_path)
        return loaded, serving

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
        return {"last_swap_stages_s": {name: round(seconds, 4) for name, seconds in self.stages_s.items()},
                "version_record": str(self.record_path), "restore": self.restore}

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
