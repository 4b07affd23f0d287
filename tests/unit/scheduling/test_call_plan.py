"""CallPlanPolicy: how one execute() call's texts are cut into engine calls (response_mode=return),
and the same planner as a batch policy in a BatchQueue."""

from __future__ import annotations

import random

import pytest

from fastpath.graphs.buckets import Sizes
from fastpath.scheduling import BatchQueue, CallPlanPolicy, CostModel, Ticket, WorkItem

LENGTHS = (16, 32, 64, 128, 256)
BATCHES = Sizes((1, 2, 4, 8, 16, 32, 64))
# Real cost models before any measurement: their linear prior ``overhead + per_token * batch * length``.
GPU_LIKE = dict(prior_overhead_s=1e-3, prior_per_token_s=1e-8)  # a launch + sync costs far more than padding
CPU_LIKE = dict(prior_overhead_s=1e-4, prior_per_token_s=1e-5)  # padded tokens cost compute


def planner(costs: dict, *, pad_to_longest: bool = False) -> CallPlanPolicy:
    return CallPlanPolicy(length_buckets=LENGTHS, batch_sizes=BATCHES, costs=CostModel(**costs), pad_to_longest=pad_to_longest)


def plan_call(lengths, costs: dict, *, pad_to_longest: bool = False):
    """The plan of a call whose texts have ``lengths`` tokens (item ``row`` = the text's position)."""
    return planner(costs, pad_to_longest=pad_to_longest).plan([WorkItem(None, row, n) for row, n in enumerate(lengths)], 0.0)


def estimate(costs: dict, batch: int, length: int) -> float:
    return CostModel(**costs).estimate(batch, length, floor=True)


def rows(planned) -> list[int]:
    return [item.row for item in planned.items]


def check_plan(plan, lengths, any_shape=False):
    """Invariants of every plan: each text in exactly one call, every call's rows a batch size holding
    its texts (exactly its texts when the engine runs any shape), and its padded length at least
    each member's tokens."""
    seen = sorted(row for planned in plan for row in rows(planned))
    assert seen == list(range(len(lengths)))
    for planned in plan:
        if any_shape:
            assert planned.batch_size == planned.texts <= BATCHES[-1]
        else:
            assert planned.batch_size in BATCHES and planned.batch_size >= planned.texts
        assert all(lengths[i] <= planned.length for i in rows(planned))
        assert planned.real_tokens == sum(lengths[i] for i in rows(planned))
        assert planned.rule == "plan"


def test_gpu_like_costs_merge_every_bucket_into_one_call():
    lengths = [9, 200, 40, 17, 100, 12]
    plan = plan_call(lengths, GPU_LIKE)
    check_plan(plan, lengths)
    assert [(p.batch_size, p.length, p.texts) for p in plan] == [(8, 256, 6)]


def test_cpu_like_costs_keep_buckets_apart():
    lengths = [9, 200, 10, 12, 11]
    plan = plan_call(lengths, CPU_LIKE)
    check_plan(plan, lengths)
    # four 16-token texts in one call (4 x 16), the 200-token text alone at 256
    assert [(p.batch_size, p.length, sorted(rows(p))) for p in plan] == [(4, 16, [0, 2, 3, 4]), (1, 256, [1])]


def test_more_texts_than_the_largest_bucket_run_as_several_calls():
    lengths = [20] * 70
    plan = plan_call(lengths, GPU_LIKE)
    check_plan(plan, lengths)
    assert [(p.batch_size, p.texts) for p in plan] == [(64, 64), (8, 6)]


def test_filler_rows_or_a_split_whichever_costs_less():
    # 33 texts: one 64-row call pads 31 rows; 32 + 1 is two calls. Padding wins when tokens are
    # cheap next to a call; the split wins when they are not.
    lengths = [30] * 33
    gpu = plan_call(lengths, GPU_LIKE)
    cpu = plan_call(lengths, CPU_LIKE)
    check_plan(gpu, lengths)
    check_plan(cpu, lengths)
    assert [p.batch_size for p in gpu] == [64]
    assert sorted(p.batch_size for p in cpu) == [1, 32]


def test_pad_to_longest_pads_each_call_to_its_longest_text_without_filler_rows():
    lengths = [9, 13, 11, 150] + [20] * 66
    plan = plan_call(lengths, CPU_LIKE, pad_to_longest=True)
    check_plan(plan, lengths, any_shape=True)
    # the three 16-bucket texts padded to 13, not 16; 66 texts of bucket 32 as 64 + 2 at 20 tokens
    assert [(p.batch_size, p.length) for p in plan] == [(3, 13), (64, 20), (2, 20), (1, 150)]


def test_the_plan_is_never_predicted_slower_than_one_call_per_bucket_or_one_call_for_all():
    rng = random.Random(7)
    for costs in (GPU_LIKE, CPU_LIKE):
        for _ in range(200):
            lengths = [rng.choice([rng.randint(1, 40), rng.randint(1, 256)]) for _ in range(rng.randint(1, 64))]
            plan = plan_call(lengths, costs)
            check_plan(plan, lengths)
            total = sum(p.predicted_s for p in plan)
            one_call = estimate(costs, BATCHES.up(len(lengths)), LENGTHS[-1] if max(lengths) > 128 else
                                next(b for b in LENGTHS if b >= max(lengths)))
            per_bucket = {}
            for tokens in lengths:
                bucket = next(b for b in LENGTHS if b >= tokens)
                per_bucket[bucket] = per_bucket.get(bucket, 0) + 1
            separate = sum(estimate(costs, BATCHES.up(n), bucket) for bucket, n in per_bucket.items())
            assert total <= min(one_call, separate) + 1e-12


def test_a_length_beyond_the_last_bucket_is_refused_naming_the_text():
    with pytest.raises(ValueError, match="text 1 has 300 tokens; expected 1..256"):
        plan_call([5, 300], GPU_LIKE)
    with pytest.raises(ValueError, match="text 0 has 300 tokens; expected 1..256"):  # a lone text too
        plan_call([300], GPU_LIKE)


@pytest.mark.parametrize("pad_to_longest", [False, True])
@pytest.mark.parametrize("costs", [GPU_LIKE, CPU_LIKE])
def test_a_lone_text_is_one_call_of_batch_1(costs, pad_to_longest):
    """Invariant: a call of one text (every call at concurrency 1) is one engine call of batch 1, at its length
    bucket (pad_to_longest: at its own length), with the cost model's floor for that shape as its prediction."""
    for tokens in (1, 16, 17, 200, 256):
        (planned,) = plan_call([tokens], costs, pad_to_longest=pad_to_longest)
        check_plan([planned], [tokens], any_shape=pad_to_longest)
        length = tokens if pad_to_longest else next(b for b in LENGTHS if b >= tokens)
        assert (planned.batch_size, planned.length, rows(planned)) == (1, length, [0])
        assert planned.predicted_s == estimate(costs, 1, length)


@pytest.mark.parametrize("costs", [GPU_LIKE, CPU_LIKE])
def test_in_a_queue_the_planner_runs_its_plan_call_by_call_and_answers_every_request_once(costs):
    """Invariant: as a BatchQueue's policy, the planner runs every queued text at once (no waiting), in
    the calls its plan of the whole queue picks, and every request is answered exactly once."""
    lengths = [9, 200, 40, 17, 100, 12] + [20] * 70
    expected = [(p.batch_size, p.length, rows(p)) for p in plan_call(lengths, costs)]
    answers = []
    queue = BatchQueue(planner(costs), max_items=128)
    tickets = [Ticket(1, lambda ticket, results, error: answers.append(ticket)) for _ in lengths]
    queue.submit([WorkItem(ticket, 0, n, payload=row) for row, (ticket, n) in enumerate(zip(tickets, lengths))], 0.0)
    formed = []
    while len(queue):
        batch = queue.next_batch(0.0).batch
        assert batch.rule == "plan" and batch.formed_s == 0.0
        formed.append((batch.batch_size, batch.length, [item.payload for item in batch.items]))
        for item in batch.items:
            item.ticket.set_row(item.row, item.tokens)
    assert formed == expected  # call by call, the queue runs the plan of the whole queue
    assert sorted(row for *_, texts in formed for row in texts) == list(range(len(lengths)))
    assert sorted(map(id, answers)) == sorted(map(id, tickets))
