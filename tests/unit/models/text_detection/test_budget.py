"""The memory budget of text_detection: the documented formula, term by term, and its bound over legal requests."""

from __future__ import annotations

import dataclasses
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.config import parse_sections
from fastpath.models.text_detection.budget import (
    ARENA_BYTES_PER_PIXEL,
    ENGINE_BYTES_PER_PIXEL,
    RequestShape,
    arena_bytes,
    call_rows,
    peak_budget,
    predict_peak,
    steady_budget,
)
from fastpath.models.text_detection.config import DetectionSchedulerConfig, TextDetectionConfig
from tests.conftest import MODEL_REPOSITORY

MIB = 1 << 20


def shipped():
    text = (MODEL_REPOSITORY / "text_detection" / "config.pbtxt").read_text()
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))
    return parse_sections(params, TextDetectionConfig, DetectionSchedulerConfig)


def test_sixteen_rgb_images_of_1400_px_under_the_shipped_config():
    """16 RGB tensors of 1400x1400 (min/736: each resized to 1408x1408 = 1,982,464 px) run as two calls of 8:
    every term of the documented formula, by hand."""
    config, sched = shipped()
    pixels = 1408 * 1408
    feed = 8 * 3 * pixels * 4  # 190 MB: a 256 MiB block; two fit in the 512 MiB pool
    budget = predict_peak(config, sched.batch_buckets, RequestShape(images=16, height=1400, width=1400))
    assert budget.request_bytes == 16 * 1400 * 1400 * 3
    assert budget.converted_bytes == 0  # the RGB tensor is used as it is
    assert budget.resized_bytes == 16 * pixels * 3
    assert budget.staging_bytes == 2 * feed
    assert budget.engine_bytes == ENGINE_BYTES_PER_PIXEL * 8 * pixels  # 190 MB > 32 MiB: no arena
    assert budget.maps_bytes == 8 * pixels * 4
    assert budget.postprocess_bytes == 4 * pixels
    assert budget.arena_bytes == 0
    assert budget.total_bytes == 2_956_758_016


def test_small_calls_are_counted_at_the_arena_rate_and_padded_to_their_bucket():
    """One 191x384 scan under min/736 is 736x1472: 13 MB of input, below arena_max_input_bytes, so A B/px;
    three images of one shape run as one call padded to the bucket of 4."""
    config, sched = shipped()
    one = predict_peak(config, sched.batch_buckets, RequestShape(images=1, height=191, width=384))
    assert one.engine_bytes == ARENA_BYTES_PER_PIXEL * 736 * 1472
    assert one.staging_bytes == 3 * 736 * 1472 * 4 and one.maps_bytes == 0
    assert call_rows(3, (1, 2, 4, 8)) == 4 and call_rows(9, (1, 2, 4, 8)) == 8 and call_rows(1, (1, 2, 4, 8)) == 1
    three = predict_peak(config, sched.batch_buckets, RequestShape(images=3, height=191, width=384))
    assert three.staging_bytes == 4 * 3 * 736 * 1472 * 4


def test_decode_threads_hold_a_copy_of_the_request_tensor():
    """With decode_threads, execute() hands the decode thread a copy of the IMAGE tensor: the request term doubles."""
    config, sched = shipped()
    request = RequestShape(images=16, height=1400, width=1400)
    threaded = dataclasses.replace(config, decode_threads=4)
    assert (predict_peak(threaded, sched.batch_buckets, request).request_bytes
            == 2 * predict_peak(config, sched.batch_buckets, request).request_bytes == 2 * 16 * 1400 * 1400 * 3)


def test_files_count_their_copies_and_one_decoded_image():
    """IMAGE_BYTES: 3 x the files; the RGB copies of all images, one decoded 16-bit RGBA image (8 B/px) and its
    8-bit copy (4 B/px), and one conversion chunk of scratch."""
    config, sched = shipped()
    request = RequestShape(images=2, height=1000, width=1000, channels=4, bytes_per_sample=2, encoded_bytes=5_000_000)
    budget = predict_peak(config, sched.batch_buckets, request)
    assert budget.request_bytes == 15_000_000
    assert budget.converted_bytes == 2 * 1_000_000 * 3 + 1_000_000 * 12 + (1 << 18) * 48


def test_the_shipped_worst_case_and_steady_budget():
    """The bound over every legal request with the shipped caps, and what may stay after the 16 x 1400 px request."""
    config, sched = shipped()
    worst = peak_budget(config, sched.batch_buckets)
    request_pixels = 64 * MIB
    assert worst.request_bytes == 3 * 8 * request_pixels
    assert worst.engine_bytes == ENGINE_BYTES_PER_PIXEL * 8 * config.largest_resized_pixels
    assert worst.arena_bytes == arena_bytes(config) == ARENA_BYTES_PER_PIXEL * config.arena_max_input_bytes // 12
    steady = steady_budget(config, sched.batch_buckets, RequestShape(images=16, height=1400, width=1400))
    assert steady == (16 * 1400 * 1400 * 3 + config.staging_keep_idle_bytes + 8 * 1408 * 1408 * 7
                      + config.heap_trim_growth_bytes + arena_bytes(config))


CONFIGS = [
    TextDetectionConfig(),  # max/960
    TextDetectionConfig(limit_type="min", limit_side_len_px=736, max_request_pixels=1 << 24, max_images_per_request=6),
    TextDetectionConfig(limit_type="min", limit_side_len_px=736, arena_max_input_bytes=1 << 30, max_batch_images=4),
    TextDetectionConfig(limit_type="min", limit_side_len_px=736, decode_threads=8, max_batch_images=16),
]


@st.composite
def legal_requests(draw):
    """A config and a request its caps accept, raw or as files no larger than their samples."""
    config, buckets = draw(st.sampled_from([(c, b) for c in CONFIGS for b in ((1, 2, 4, 8), (1, 2, 4), (1, 3))]))
    images = draw(st.integers(1, config.max_images_per_request))
    per_image = min(config.max_image_pixels, config.max_request_pixels // images)
    height = draw(st.integers(1, min(per_image, 20000)))
    width = draw(st.integers(1, per_image // height))
    channels = draw(st.integers(1, 4))
    encoded = draw(st.booleans())
    sample = draw(st.sampled_from([1, 2])) if encoded else 1
    files = draw(st.integers(1, images * height * width * channels * sample)) if encoded else None
    return config, buckets, RequestShape(images=images, height=height, width=width, channels=channels,
                                         encoded_bytes=files, bytes_per_sample=sample)


@settings(max_examples=300, deadline=None)
@given(legal_requests())
def test_no_legal_request_is_predicted_above_the_budget(case):
    """Invariant: for every request the caps accept, each term of predict_peak <= the same term of
    peak_budget (so the totals too)."""
    config, buckets, request = case
    if max(buckets) > config.max_batch_images:
        buckets = tuple(b for b in buckets if b <= config.max_batch_images)
    predicted, bound = predict_peak(config, buckets, request), peak_budget(config, buckets)
    for term, value in vars(predicted).items():
        assert value <= getattr(bound, term), (term, value, getattr(bound, term))
