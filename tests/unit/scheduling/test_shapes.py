"""ExactShapePolicy in a BatchQueue: exact-shape buckets (resized image sizes) on a fake clock.

Items carry ``shape`` = resized (height, width) and ``tokens`` = 32x32 cells, as text_detection
submits them. Costs are the CPU and GPU shapes of tests/unit/scheduling/conftest.py.
"""

from __future__ import annotations

import pytest

from fastpath.errors import UnavailableError
from fastpath.scheduling import BatchQueue, CostModel, ExactShapePolicy, Ticket, WorkItem

from .conftest import CPU, GPU, submit


def make_queue(costs: dict = CPU, *, max_queue_delay_s: float = 0.0, max_items: int = 64, batch_sizes=(1, 2, 4, 8),
               max_idle_shapes: int = 64) -> BatchQueue:
    """A queue of images under the exact-shape policy, as text_detection builds it."""
    policy = ExactShapePolicy(batch_sizes=batch_sizes, costs=CostModel(0.2, **costs), max_queue_delay_s=max_queue_delay_s,
                              min_padding_gain=1.0, max_idle_shapes=max_idle_shapes)
    return BatchQueue(policy, max_items=max_items, unit="images")


def images(answers, *shapes: tuple[int, int], label: str = "") -> list[WorkItem]:
    """One request of len(shapes) images, each item keyed by its resized (h, w), tokens = 32x32 cells."""
    ticket = Ticket(len(shapes), answers, label=label)
    return [WorkItem(ticket, row, (h // 32) * (w // 32), payload=f"{label}#{row}", shape=(h, w))
            for row, (h, w) in enumerate(shapes)]


def drain(queue, clock):
    batches = []
    while len(queue):
        batches.append(queue.next_batch(clock.now()).batch)
    return batches


@pytest.mark.parametrize("costs", [CPU, GPU])
def test_batches_never_mix_shapes_even_with_equal_area_or_when_merging_would_pay(answers, clock, costs):
    """960x480 and 480x960 have the same 450 cells; 32x32 and 32x64 are neighbours. BatchQueue would merge
    neighbouring length buckets on GPU-like costs; exact shapes never are."""
    queue = make_queue(costs)
    for shape in [(960, 480), (480, 960), (32, 32), (32, 64)] * 3:
        submit(queue, clock, images(answers, shape))
    batches = drain(queue, clock)
    for batch in batches:
        assert len({item.shape for item in batch.items}) == 1
        (shape,) = {item.shape for item in batch.items}
        assert batch.length == (shape[0] // 32) * (shape[1] // 32)
    served = sorted((b.items[0].shape, b.batch_size, len(b.items)) for b in batches)
    if costs is CPU:  # per-pixel cost dominates large images (cut 3 -> 2 + 1), call overhead tiny ones (pad 3 -> 4)
        assert served == [((32, 32), 4, 3), ((32, 64), 4, 3), ((480, 960), 1, 1), ((480, 960), 2, 2),
                          ((960, 480), 1, 1), ((960, 480), 2, 2)]
    else:
        assert served == [((32, 32), 4, 3), ((32, 64), 4, 3), ((480, 960), 4, 3), ((960, 480), 4, 3)]


def test_oldest_shape_runs_first_and_takes_its_whole_bucket(answers, clock):
    queue = make_queue(CPU, max_queue_delay_s=1.0)
    first = submit(queue, clock, images(answers, (640, 480), label="a"))
    others = submit(queue, clock, images(answers, (320, 320), (320, 320), label="b"))
    second = submit(queue, clock, images(answers, (640, 480), label="c"))
    batch = queue.next_batch(clock.now()).batch
    assert batch.items == (first[0], second[0]) and batch.batch_size == 2 and batch.rule == "idle"
    assert queue.next_batch(clock.now()).batch.items == tuple(others)


@pytest.mark.parametrize(("costs", "sizes"), [(CPU, [(4, 4), (1, 1)]), (GPU, [(8, 5)])])
def test_five_images_of_one_shape_cut_to_buckets_on_cpu_and_pad_with_filler_on_gpu(answers, clock, costs, sizes):
    queue = make_queue(costs)
    submit(queue, clock, images(answers, *[(640, 640)] * 5))
    assert [(b.batch_size, len(b.items)) for b in drain(queue, clock)] == sizes


def test_a_full_largest_batch_of_one_shape_runs_before_older_items_wait_for_company(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=1.0)
    submit(queue, clock, images(answers, (96, 96)), engine_busy=True)
    full = submit(queue, clock, images(answers, *[(64, 128)] * 8), engine_busy=True)
    batch = queue.next_batch(clock.now()).batch
    assert batch.rule == "full" and batch.items == tuple(full) and queue.queued((96, 96)) == 1


def test_timeout_and_max_delay_apply_per_item(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=2e-3)
    (late,) = submit(queue, clock, images(answers, (64, 64)), timeout_s=1e-3)
    (patient,) = submit(queue, clock, images(answers, (64, 64)))
    clock.advance(2.5e-3)
    decision = queue.next_batch(clock.now())
    assert decision.expired == (late,) and decision.batch.items == (patient,) and decision.batch.rule == "delay"


def test_queue_bound_counts_images_and_rejects_a_request_whole(answers, clock):
    queue = make_queue(CPU, max_items=8)
    submit(queue, clock, images(answers, *[(64, 64)] * 6))
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        submit(queue, clock, images(answers, (64, 64), (32, 32), (32, 32)))
    assert len(queue) == 6 and queue.queued((32, 32)) == 0


def test_idle_shape_buckets_are_forgotten_beyond_max_idle_shapes(answers, clock):
    queue = make_queue(CPU, max_idle_shapes=2)
    (waiting,) = submit(queue, clock, images(answers, (32, 32)))
    submit(queue, clock, images(answers, (64, 64)))
    assert queue.next_batch(clock.now()).batch.items == (waiting,)  # (32, 32) is now empty, (64, 64) queued
    submit(queue, clock, images(answers, (96, 96)))
    assert queue.bucket_keys() == ((64, 64), (96, 96))
    assert [b.items[0].shape for b in drain(queue, clock)] == [(64, 64), (96, 96)]


def test_a_request_of_new_shapes_beyond_max_idle_shapes_keeps_all_its_buckets(answers, clock):
    queue = make_queue(CPU, max_idle_shapes=2)
    (old,) = submit(queue, clock, images(answers, (32, 32)))
    queue.next_batch(clock.now())  # (32, 32) is now idle
    items = submit(queue, clock, images(answers, (64, 64), (96, 96), (64, 64)))
    assert queue.bucket_keys() == ((64, 64), (96, 96)) and old.shape not in queue.bucket_keys()
    batches = drain(queue, clock)
    assert sorted((b.items[0].shape, len(b.items)) for b in batches) == [((64, 64), 2), ((96, 96), 1)]
    assert {id(item) for b in batches for item in b.items} == {id(item) for item in items}


def test_close_drains_and_remove_all_empties_every_shape(answers, clock):
    queue = make_queue(GPU, max_queue_delay_s=1.0)
    submit(queue, clock, images(answers, (64, 64), (32, 32)), engine_busy=True)
    queue.close()
    assert queue.next_batch(clock.now()).batch.rule == "drain"
    assert len(queue.remove_all()) == 1 and len(queue) == 0
    with pytest.raises(UnavailableError, match="shutting down"):
        submit(queue, clock, images(answers, (64, 64)))


def test_items_without_a_shape_or_with_inconsistent_tokens_are_refused(answers, clock):
    queue = make_queue(CPU)
    ticket = Ticket(1, answers)
    with pytest.raises(ValueError, match="need a shape"):
        queue.submit([WorkItem(ticket, 0, 4)], clock.now())
    submit(queue, clock, images(answers, (64, 64)))
    with pytest.raises(ValueError, match="same tokens"):
        queue.submit([WorkItem(ticket, 0, 5, shape=(64, 64))], clock.now())
    assert len(queue) == 1


def test_a_full_queue_names_images_not_texts(answers, clock):
    queue = make_queue(max_items=2)
    submit(queue, clock, images(answers, (32, 32), (32, 32)))
    with pytest.raises(UnavailableError, match=r"2 images queued \+ 1 in this request > max_queue_images=2"):
        submit(queue, clock, images(answers, (32, 32)))
