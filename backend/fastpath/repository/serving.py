"""What a serving text-embedding instance holds for live swaps: slots + agent, in one object."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import ctypes
import ctypes.util

from fastpath.build.manifest import sha256_file
from fastpath.config import TextEmbeddingConfig
from fastpath.errors import ArtifactError
from fastpath.models.text_embedding import TextEmbedder
from fastpath.repository.agent import SwapAgent
from fastpath.repository.control import ControlPlane, state_dir
from fastpath.repository.golden import check_engine_io, load_text_version, validate_text_version
from fastpath.repository.slots import EngineSlots


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
        self._tokenizer_sha256 = sha256_file(self.model_dir / str(version) / config.tokenizer)
        self.slots: EngineSlots[TextEmbedder] = EngineSlots(version, self.initial, on_release=release_freed_memory)
        plane = ControlPlane(state_dir(self.model_dir.parent), model_name)
        self.agent = SwapAgent(plane, instance, self.slots, self._load, self._validate).start()

    def _load(self, version: int) -> TextEmbedder:
        return load_text_version(self.model_dir, version, self.config)

    def _validate(self, embedder: TextEmbedder, version: int) -> None:
        tokenizer = self.model_dir / str(version) / self.config.tokenizer
        if sha256_file(tokenizer) != self._tokenizer_sha256:
            raise ArtifactError(
                f"{tokenizer} differs from the serving version's tokenizer; queued requests are already tokenized, "
                "so a live swap needs the same tokenizer (load a new tokenizer through Triton's model load instead)"
            )
        validate_text_version(embedder, self.model_dir / str(version), checksums_verified=True)

    @contextlib.contextmanager
    def lease(self) -> Iterator[tuple[TextEmbedder, int]]:
        """(embedder, version) of the active slot, held for one batch."""
        with self.slots.lease() as pair:
            yield pair

    def close(self) -> None:
        """Stop the agent, release every slot (idempotent)."""
        self.agent.stop()
        self.slots.close()
