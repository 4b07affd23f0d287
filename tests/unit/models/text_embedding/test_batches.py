"""text_embedding's batch path through the host staging pool, with the real fp32 engine:
each batch is padded once into one leased block, results equal the engine on ordinary arrays, the
lease is back after the engine call, steady state allocates nothing (not even the block's views),
and unload releases what was staged but never ran."""

import numpy as np
import pytest

from fastpath.graphs import BERT_INPUTS, Bucket
from fastpath.graphs.staging import packed_inputs
from fastpath.memory import create_host_pool
from fastpath.models.text_embedding.batches import TOKEN_INPUTS, EmbeddingBatchHandler, staging_pool_config
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.pipeline import TextEmbedder
from fastpath.models.text_embedding.versions import VersionedEmbedder
from fastpath.scheduling import Batch, Ticket, WorkItem
from tests.conftest import MODEL_REPOSITORY


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    import os

    os.environ["FASTPATH_STATE_DIR"] = str(tmp_path_factory.mktemp("state"))
    versions = VersionedEmbedder(MODEL_REPOSITORY / "text_embedding", 1, TextEmbeddingConfig(), instance="te_0",
                                 model_name="text_embedding")
    yield versions
    versions.close()


def _batch(tokenizer, texts, size, length):
    answers = []
    ticket = Ticket(len(texts), lambda t, rows, error: answers.append((rows, error)))
    items = tuple(WorkItem(ticket, row, len(e.ids), e) for row, e in enumerate(tokenizer.encode(texts)))
    return Batch(items=items, batch_size=size, length=length, rule="test", formed_s=0.0, predicted_s=0.0), answers


def test_batches_are_staged_in_one_pool_block_and_answer_like_the_plain_engine(versions):
    pool = create_host_pool(staging_pool_config(64, 256), allocator="page-aligned", name="staging")
    handler = EmbeddingBatchHandler(versions, pool)
    texts = ["staging pools hold batches", "one DMA per input", "a third, longer text than the other two are"]
    embedder: TextEmbedder = versions.initial
    expected = embedder.embed(texts).embeddings
    try:
        for round_index in range(5):
            batch, answers = _batch(embedder.tokenizer, texts, 4, 16)  # one filler row
            staged = handler.stage(batch)
            assert staged.lease.nbytes == TOKEN_INPUTS * 4 * 16 * 8
            assert all(np.shares_memory(array, staged.lease.view(np.uint8, staged.lease.nbytes))
                       for array in staged.feeds.values())
            assert pool.stats().outstanding == 1
            # the graph runner's one-DMA path takes the three inputs as one [3, b, L] block, no copy
            packed = packed_inputs(staged.feeds, BERT_INPUTS, Bucket(4, 16))
            assert packed is not None and np.shares_memory(packed, staged.feeds["input_ids"])
            np.testing.assert_array_equal(packed[1], staged.feeds["attention_mask"])
            outputs = handler.run(staged)
            assert pool.stats().outstanding == 0 and staged.lease.released
            handler.finish(batch, outputs)
            (rows, error), = answers
            assert error is None
            np.testing.assert_allclose(np.stack([row.embedding for row in rows]), expected, atol=1e-5)
            if round_index == 0:
                allocations, feeds = pool.stats().allocations, staged.feeds
            assert staged.feeds is feeds  # the block's views are made once, kept with it for its next leases
        assert pool.stats().allocations == allocations == 1  # steady state: no new allocation
        left, _ = _batch(embedder.tokenizer, texts[:1], 1, 16)
        handler.stage(left)  # staged, never run (a drain that timed out)
        assert handler.close() == 1 and pool.stats().outstanding == 0
    finally:
        assert pool.close().ok


def test_the_largest_batch_fits_one_block():
    config = staging_pool_config(64, 256)
    assert config.max_block_bytes >= TOKEN_INPUTS * 64 * 256 * 8 and config.capacity_bytes == 4 * config.max_block_bytes


def test_a_calls_planned_batches_answer_like_the_plain_engine_in_call_order_and_leave_no_lease(versions):
    """Invariants: run_plan returns every text's embedding in the call's order (its batches grouped by length,
    shortest first), equal to the plain engine's, with the serving version; each batch's lease is back after its
    engine call; a second call of the same shapes allocates nothing."""
    from fastpath.scheduling import CallPlanPolicy
    from fastpath.scheduling.costs import CostModel

    pool = create_host_pool(staging_pool_config(64, 256), allocator="page-aligned", name="staging")
    handler = EmbeddingBatchHandler(versions, pool)
    embedder: TextEmbedder = versions.initial
    texts = ["a longer text, " * 12, "short", "a middling text of some words", "tiny", "another long one, " * 10]
    planner = CallPlanPolicy(length_buckets=(16, 64, 256), batch_sizes=(1, 2, 4, 8), costs=CostModel(), pad_to_longest=True)
    expected = embedder.embed(texts).embeddings
    try:
        allocations = []
        for _ in range(2):
            encodings = embedder.tokenizer.encode(texts)
            plan = planner.plan([WorkItem(None, row, len(e.ids), e) for row, e in enumerate(encodings)], 0.0)
            ran = []
            embeddings, version = handler.run_plan(len(texts), plan, lambda batch, seconds, ran=ran: ran.append(batch))
            assert len(plan) > 1 and ran == plan and version == 1
            np.testing.assert_allclose(embeddings, expected, atol=1e-5)
            assert pool.stats().outstanding == 0
            allocations.append(pool.stats().allocations)
        assert allocations[1] == allocations[0]
    finally:
        assert handler.close() == 0
        assert pool.close().ok
