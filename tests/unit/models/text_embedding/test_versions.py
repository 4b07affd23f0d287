"""VersionedEmbedder: versions are verified once in the background, at low priority; swaps report their stages."""

import os
import threading

from fastpath.manifest import verify_manifest
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.versions import BACKGROUND_NICE, VersionedEmbedder, lower_thread_priority
from tests.conftest import MODEL_REPOSITORY


def test_lower_thread_priority_changes_only_the_calling_thread():
    seen = {}

    def background():
        lower_thread_priority()
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen["thread"] == min(own + BACKGROUND_NICE, 19)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own


def test_versions_are_preverified_and_a_swap_hashes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTPATH_STATE_DIR", str(tmp_path))
    model_dir = MODEL_REPOSITORY / "text_embedding"
    versions = VersionedEmbedder(model_dir, 1, TextEmbeddingConfig(), instance="te_0", model_name="text_embedding")
    try:
        versions._preverifier.join(timeout=60)
        hashed = versions.checksums.misses
        assert hashed >= 8  # every file of versions 1 and 2
        verify_manifest(model_dir / "2", checksums=versions.checksums)
        assert versions.checksums.misses == hashed
        versions.slots.swap(2, versions._load, versions._validate)
        assert versions.checksums.misses == hashed and versions.slots.active_version == 2
        assert set(versions.stages_s) == {"verify_s", "engine_load_s", "warmup_s", "golden_s"}
    finally:
        versions.close()
