"""FastPath's timeline (``FASTPATH_TIMELINE``, fastpath.profiling) under a real tritonserver serving text_detection.

Invariants, after 12 concurrent one-image requests of real photos and a server stop:
* the model instance wrote one Chrome trace at unload;
* every image went through every stage exactly once: the units of ``execute.decode``, ``scheduler.stage`` and
  ``scheduler.run`` each sum to 12, and ``post.db`` has 12 spans;
* a thread does one thing of a phase at a time: no two spans of one phase on one thread overlap;
* benchmarks/timeline.py sums the trace: the engine was busy part of the time, and every phase it lists ran.
"""

from __future__ import annotations

import concurrent.futures
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, start_server
from tests.e2e.test_text_detection import MODEL, detect_array
from tests.unit.models.text_detection.reference import skimage_rgb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from timeline import load_spans, summary  # noqa: E402

pytestmark = pytest.mark.e2e
PHOTOS = ("page.png", "coffee.png", "astronaut.png", "text.png")


def test_a_served_load_leaves_a_timeline_with_every_image_in_every_stage(tmp_path, monkeypatch):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    monkeypatch.setenv("FASTPATH_TIMELINE", str(tmp_path / "timeline"))
    (tmp_path / "server").mkdir()
    server = start_server(tmp_path / "server", models=(MODEL,))
    try:
        images = [skimage_rgb(PHOTOS[k % len(PHOTOS)]) for k in range(12)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda image: detect_array(server, "grpc", image[None]), images))
        assert len(results) == 12
    finally:
        server.stop()
    traces = sorted((tmp_path / "timeline").glob("*.trace.json"))
    assert [p.name for p in traces] == [f"{MODEL}_0_0.trace.json"]
    spans = load_spans(traces)
    units, count = defaultdict(int), defaultdict(int)
    for span in spans:
        units[span.phase] += span.count
        count[span.phase] += 1
    assert (units["execute.decode"], units["scheduler.stage"], units["scheduler.run"], count["post.db"]) == (12, 12, 12, 12)
    by_thread = defaultdict(list)
    for span in spans:
        by_thread[(span.phase, span.tid)].append(span)
    for (phase, _), own in by_thread.items():
        for before, after in zip(own, own[1:]):
            assert before.end_s <= after.start_s + 1e-6, f"two {phase} spans overlap on one thread"
    result = summary(spans, spans[0].start_s, max(s.end_s for s in spans))
    assert 0 < result["engine_busy_share"] <= 1
    assert all(row["busy_s"] >= 0 and row["spans"] > 0 for row in result["phases"].values())
