"""``TritonPythonModel`` for text embedding (``model_repository/text_embedding``).

Tensors (:data:`TextEmbeddingModel.INPUTS`/``OUTPUTS``, checked against ``config.pbtxt`` at load;
max_batch_size > 0, so each carries a batch dimension n; docs/models.md): ``TEXT`` (BYTES [n, 1], UTF-8)
in; ``EMBEDDING`` (FP32 [n, 384], L2-normalized mean pooling), ``TOKEN_COUNT`` (INT32 [n, 1], [CLS] and
[SEP] included), ``TRUNCATED`` (BOOL [n, 1]) and ``MODEL_VERSION`` (INT32 [n, 1], the version whose
engine produced the row; every row of one response comes from one version, docs/design/hot-swap.md) out.

``execute`` validates and tokenizes each request and hands its texts to FastPath's scheduler, which
batches texts by length and cost and answers each request through its response sender
(``response_mode=sender``), or runs the call's texts itself and returns the responses
(``response_mode=return``). A bad request gets its own 400 at once; a full queue a 503. Request options
(Triton's ``timeout``, the ``fastpath_priority`` parameter): :mod:`fastpath.triton.requests`.
Design: docs/design/scheduler.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.errors import QueueTimeoutError
from fastpath.graphs.buckets import Sizes
from fastpath.memory import create_host_pool
from fastpath.models.text_embedding.batches import (
    EmbeddingBatchHandler,
    EmbeddingRow,
    output_array,
    register_allocation_counters,
    staging_pool_config,
    warm_up,
)
from fastpath.models.text_embedding.config import EmbeddingSchedulerConfig, TextEmbeddingConfig, placed_config
from fastpath.models.text_embedding.pipeline import EMBEDDING_DIM, scheduler_grid
from fastpath.models.text_embedding.versions import VersionedEmbedder
from fastpath.profiling import PROFILE
from fastpath.scheduling import Batch, BatchQueue, CallPlanPolicy, LengthBucketPolicy, Ticket, WorkItem
from fastpath.text import decode_texts, set_tokenizer_parallelism
from fastpath.triton.io import TensorSpec, error_response, input_rows, read_input
from fastpath.triton.requests import Replies, answer_counted, priority_level, request_timeout_s, requested_outputs
from fastpath.triton.scheduled import ScheduledModel

LOG = logging.getLogger(__name__)
INPUT_NAME = "TEXT"


OUTPUT_NAMES = ("EMBEDDING", "TOKEN_COUNT", "TRUNCATED", "MODEL_VERSION")
# A request's texts run in the batches of their length buckets, so a swap's flip can fall between
# them, and one response could mix versions (MODEL_VERSION [2, 1, 2, 2]: fp32 and INT8 rows).
# Such rows run again on the active version; another flip meanwhile may repeat that, this many times.
MAX_VERSION_RERUNS = 2


@dataclasses.dataclass(frozen=True)
class Rerun:
    """A request's state for version reruns: its encodings, its priority level, and its reruns so far."""

    encodings: list[Any]
    level: int
    reruns: int = 0


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A sender-mode request that passed validation: its position in the call, its texts and options."""

    index: int
    request: Any
    texts: list[str]
    level: int
    timeout_s: float | None


class TextEmbeddingModel(ScheduledModel):
    """The python-backend model class; ``model.py`` re-exports it as ``TritonPythonModel``."""

    NAME = "text_embedding"
    CONFIG = TextEmbeddingConfig
    SCHEDULER_CONFIG = EmbeddingSchedulerConfig
    UNIT = "texts"
    INPUTS = (TensorSpec(INPUT_NAME, "TYPE_STRING", (1,)),)
    OUTPUTS = (TensorSpec("EMBEDDING", "TYPE_FP32", (EMBEDDING_DIM,)), TensorSpec("TOKEN_COUNT", "TYPE_INT32", (1,)),
               TensorSpec("TRUNCATED", "TYPE_BOOL", (1,)), TensorSpec("MODEL_VERSION", "TYPE_INT32", (1,)))

    def load(self, args: dict[str, str], model_config: dict[str, Any]) -> Sizes:
        """Tokenizer and engine of every version (on the GPU Triton assigned a KIND_GPU instance), the
        bucket grid the engine captured, and the staging pool; the grid's batch sizes."""
        self.config = placed_config(self.config, args)
        sched = self.scheduler_config
        # inline_when_idle tells a lone request from a backlog by the call's request count, which only
        # Triton's batcher makes meaningful; and it can only put requests of up to half of
        # max_batch_size texts two to a call: a larger request always goes to the bounded queue.
        batched = model_config.get("dynamic_batching") is not None
        self.inline_max_texts = int(model_config.get("max_batch_size", 0)) // 2 if sched.inline_when_idle and batched else 0
        if sched.inline_when_idle and not batched:
            LOG.warning("inline_when_idle is off for %s: it needs dynamic_batching in config.pbtxt "
                        "(max_queue_delay_microseconds: 0 adds no delay)", self.model_name)
        beyond = [b for b in self.config.length_buckets_tokens if b > self.config.max_seq_length]
        if beyond:  # texts are cut at max_seq_length tokens, so no batch is ever padded past it
            LOG.warning("length_buckets_tokens %s of %s exceed max_seq_length %d: they serve as %d", ",".join(map(str, beyond)),
                        self.model_name, self.config.max_seq_length, self.config.max_seq_length)
        set_tokenizer_parallelism(self.config.tokenizer_parallelism, self.config.tokenizer_threads)
        if sched.response_mode == "return" and self.config.concurrent_batches == 0:
            # execute() runs its batches one after another on the main session: lanes would sit unused
            self.config = dataclasses.replace(self.config, concurrent_batches=1)
        self.versions = VersionedEmbedder(Path(args["model_repository"]), int(self.model_version), self.config,
                                          instance=args.get("model_instance_name", "text_embedding_0"),
                                          model_name=self.model_name)
        self.embedder = self.versions.initial
        self.grid = scheduler_grid(self.config, sched, self.embedder.engine)  # refuses batch sizes the engine lacks
        self.pool = create_host_pool(staging_pool_config(self.grid.max_batch, self.config.max_seq_length), name="staging",
                                     device=self.config.device)
        return self.grid.batch_sizes

    def batch_handler(self, on_batch: Any) -> EmbeddingBatchHandler:
        return EmbeddingBatchHandler(self.versions, self.pool, on_batch=on_batch)

    def batch_policy(self, sizes: Sizes) -> LengthBucketPolicy:
        """The length-bucket policy of the queue, and the call planner (return mode and inline calls)
        beside it on the same cost model. ONNX Runtime on the CPU runs any shape: pad to the longest
        text, not up to its bucket."""
        shapes = {"batch_sizes": sizes, "length_buckets": self.grid.lengths, "pad_to_longest": not self.embedder.engine.buckets}
        policy = LengthBucketPolicy(**shapes, **self.scheduler_config.policy_options())
        self.costs = policy.costs
        self.planner = CallPlanPolicy(**shapes, costs=self.costs)
        return policy

    def warm_up(self, queue: BatchQueue) -> None:
        warm_up(self.handler, self.grid, self.costs, self.runner.clock)

    def lanes(self) -> int:
        return max(1, self.embedder.engine.lanes)

    def runs_queue(self) -> bool:
        """Return mode runs each ``execute()``'s texts itself (:meth:`_execute_call`): no runner threads."""
        return self.scheduler_config.response_mode == "sender"

    def started(self) -> None:
        if PROFILE.enabled:
            register_allocation_counters(self.pool, self.embedder.engine)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Answer the call's requests; see ``response_mode`` for how answers return.

        Returns:
            One response per request, in order (``response_mode=return``: :meth:`_execute_call`
            runs the call's texts itself), or None (``response_mode=sender``: the texts are queued
            and the scheduler answers each request through its response sender), except when a
            sender-mode call of one request finds the scheduler idle: that call runs inline.
        """
        if self.scheduler_config.response_mode == "return":
            return answer_counted(self.progress, requests, self._execute_call)
        # One request in the call (Triton's batcher hands a call everything queued in Triton, so more
        # means a backlog), small enough that a second one would have fit in the call, and an idle
        # runner: run it here and skip the hand-offs and the sender.
        if not (len(requests) == 1 and 0 < self._texts_in(requests[0]) <= self.inline_max_texts and self.runner.claim_idle()):
            return self._execute(requests)
        try:
            return answer_counted(self.progress, requests, self._execute_call)
        finally:
            self.runner.release_inline()

    def _texts_in(self, request: Any) -> int:
        """Rows of the request's TEXT input (0 when it is missing: the request fails on the usual path)."""
        return input_rows(self._pb, request, INPUT_NAME) or 0

    def _execute_call(self, requests: list[Any]) -> list[Any]:
        """Run every text of the call now, in the batches the call planner picks, and return the responses.

        One tokenizer call for all texts, one version lease for all batches (every row of the call
        comes from one model version), and each response's outputs are row slices of the call's
        output arrays. Priorities have nothing to order here (every text runs before the call
        returns), but a bad priority parameter still fails its request. A request's timeout counts
        from the call's start, as in the queue: one that has passed by the time the request is read
        is answered UNAVAILABLE "Request timeout expired" (once read, its texts run). A bad request
        fails alone; a tokenizer or engine failure fails the call's requests.
        """
        pb = self._pb
        started = mark = PROFILE.start()
        arrival_s = time.perf_counter()
        responses: list[Any] = [None] * len(requests)
        texts, spans = self._read_call(requests, arrival_s, responses)
        mark = PROFILE.lap("execute.decode", mark, len(requests))
        if spans:
            try:
                encodings = self.embedder.tokenizer.encode(texts, parallel=self._parallel(len(texts)))
                mark = PROFILE.lap("execute.tokenize", mark, len(texts))
                lengths = [len(e.ids) for e in encodings]
                rows = [WorkItem(None, row, tokens, encoding) for row, (tokens, encoding) in enumerate(zip(lengths, encodings))]
                plan = self.planner.plan(rows, time.perf_counter())
                mark = PROFILE.lap("execute.plan", mark, len(plan))
                waited_s = time.perf_counter() - arrival_s
                embeddings, version = self.handler.run_plan(len(encodings), plan, functools.partial(self._ran, waited_s))
            except Exception as exc:
                LOG.error("a call of %d texts failed: %s", len(texts), exc)
                for index, *_ in spans:
                    responses[index] = error_response(pb, exc, requests[index].request_id())
            else:
                mark = PROFILE.lap("execute.run", mark, len(plan))
                count = len(texts)
                outputs = {"EMBEDDING": embeddings, "TOKEN_COUNT": np.array(lengths, dtype=np.int32).reshape(count, 1),
                           "TRUNCATED": self._truncated(encodings, lengths),
                           "MODEL_VERSION": np.full((count, 1), version, dtype=np.int32)}
                mark = PROFILE.lap("execute.outputs", mark, count)
                for index, first, end, wanted in spans:
                    # only the requested outputs are built and sent: each pb.Tensor is a copy into the stub's shared memory
                    whole = first == 0 and end == count  # the call's only request: its outputs as they are, no slices
                    responses[index] = pb.InferenceResponse(output_tensors=[
                        pb.Tensor(name, outputs[name] if whole else outputs[name][first:end])
                        for name in OUTPUT_NAMES if not wanted or name in wanted])
                PROFILE.lap("respond", mark, len(spans))
        if PROFILE.enabled:
            PROFILE.lap("execute.total", started, len(requests))
            PROFILE.dump(self.instance_name, force=False)
        return responses

    def _read_call(self, requests: list[Any], arrival_s: float, responses: list[Any]) -> tuple[list[str], list[tuple]]:
        """The call's texts in request order, and each readable request's (index, first text, end,
        requested outputs); a bad or timed-out request gets its response in ``responses`` now."""
        texts: list[str] = []
        spans = []
        for index, request in enumerate(requests):
            try:
                decoded = decode_texts(read_input(self._pb, request, INPUT_NAME), tensor=INPUT_NAME,
                                       max_text_bytes=self.config.max_text_bytes)
                if request.parameters() not in ("", "{}"):
                    priority_level(request, self.scheduler_config)  # raises on a bad value
                timeout_s = request_timeout_s(request, self.scheduler_config)
            except Exception as exc:  # a bad request fails alone
                self.metrics.invalid_request()
                responses[index] = error_response(self._pb, exc, request.request_id())
                continue
            if timeout_s is not None and time.perf_counter() - arrival_s > timeout_s:
                self._expire(responses, index, request, len(decoded), time.perf_counter() - arrival_s, timeout_s)
                continue
            spans.append((index, len(texts), len(texts) + len(decoded), requested_outputs(request)))
            texts.extend(decoded)
        return texts, spans

    def _truncated(self, encodings: list[Any], lengths: list[int]) -> np.ndarray:
        """TRUNCATED, bool [n, 1] (``TextTokenizer.truncated``); a call without a full-length text is all false."""
        tokenizer = self.embedder.tokenizer
        if max(lengths, default=0) < tokenizer.max_seq_length:
            return np.zeros((len(lengths), 1), dtype=np.bool_)
        return np.array([tokenizer.truncated(e) for e in encodings], dtype=np.bool_).reshape(-1, 1)

    def _parallel(self, texts: int) -> bool | None:
        """Whether a call of ``texts`` texts tokenizes on the Rayon pool (None: parallelism is off)."""
        config = self.config
        return texts >= config.tokenizer_parallel_min_texts if config.tokenizer_parallelism else None

    def _ran(self, waited_s: float, planned: Batch, seconds: float) -> None:
        """An engine call of a planned batch finished: teach the cost model, publish the batch metrics
        (each text's queue delay: ``waited_s``, from the call's start to its first engine call)."""
        self.costs.observe(planned.batch_size, planned.length, seconds)
        self.progress.advance()
        self.metrics.ran_inline(planned, waited_s, seconds)

    def _expire(self, responses: list[Any], index: int, request: Any, texts: int, waited_s: float, timeout_s: float) -> None:
        """Answer request ``index`` UNAVAILABLE: its timeout passed before its texts could run."""
        self.metrics.rejected("timeout", texts)
        responses[index] = error_response(self._pb, QueueTimeoutError(
            f"Request timeout expired: the request waited {waited_s * 1e6:.0f} us before its batch ran and its timeout "
            f"is {timeout_s * 1e6:.0f} us; retry with a longer timeout or when the server is less loaded"), request.request_id())

    def _execute(self, requests: list[Any]) -> None:
        """Sender mode: validate and tokenize each request and queue its texts; the scheduler answers them."""
        pb = self._pb
        started = mark = PROFILE.start()
        replies = Replies(pb, requests, "sender", self.progress)
        accepted: list[Accepted] = []
        for index, request in enumerate(requests):
            try:
                texts = decode_texts(read_input(pb, request, INPUT_NAME), tensor=INPUT_NAME,
                                     max_text_bytes=self.config.max_text_bytes)
                accepted.append(Accepted(index, request, texts, priority_level(request, self.scheduler_config),
                                         request_timeout_s(request, self.scheduler_config)))
            except Exception as exc:  # a bad request fails alone
                self.metrics.invalid_request()
                replies.fail(index, exc)
        mark = PROFILE.lap("execute.decode", mark, len(requests))
        try:
            texts = [text for entry in accepted for text in entry.texts]
            encodings = self.embedder.tokenizer.encode(texts, parallel=self._parallel(len(texts))) if texts else []
        except Exception as exc:
            for entry in accepted:
                replies.fail(entry.index, exc)
            accepted = []
        mark = PROFILE.lap("execute.tokenize", mark, len(encodings))
        start = 0
        for entry in accepted:
            request, count = entry.request, len(entry.texts)
            answer = functools.partial(self._answer, replies, entry.index, requested_outputs(request),
                                       Rerun(encodings[start:start + count], entry.level))
            ticket = Ticket(count, answer, is_cancelled=request.is_cancelled, label=replies.request_id(entry.index) or "request")
            items = [WorkItem(ticket, row, len(encodings[start + row].ids), encodings[start + row], entry.level)
                     for row in range(count)]
            start += count
            try:
                self.runner.submit(items, timeout_s=entry.timeout_s)
            except Exception as exc:  # queue full or shutting down: UNAVAILABLE, retryable
                ticket.fail(exc)  # through the ticket: the request is answered once, whatever the queue kept
        PROFILE.lap("execute.submit", mark, len(accepted))
        if PROFILE.enabled:
            PROFILE.lap("execute.total", started, len(requests))
            PROFILE.dump(self.instance_name, force=False)
        return replies.result()

    def _answer(self, replies: Replies, index: int, wanted: frozenset[str], rerun: Rerun,
                ticket: Ticket | None, rows: list[EmbeddingRow] | None, error: BaseException | None) -> None:
        """The request's single answer: its rows stacked into the requested outputs, or its error.

        Rows from different model versions (a swap flipped between the request's batches) send the
        rows not from the active version through the scheduler again first, at most
        ``MAX_VERSION_RERUNS`` times (``rerun`` counts them).
        """
        pb = self._pb
        if error is not None:
            replies.fail(index, error)
            return
        if len({row.version for row in rows}) > 1 and rerun.reruns < MAX_VERSION_RERUNS and self._rerun(replies, index, wanted, rerun, rows):
            return
        mark = PROFILE.start()
        # Only the requested outputs are built (each pb.Tensor is a copy into the stub's shared memory)
        # and sent: an unrequested output sent after execute() returned killed the 2.51 stub (scheduled.py).
        replies.answer(index, pb.InferenceResponse(output_tensors=[
            pb.Tensor(name, output_array(name, rows)) for name in OUTPUT_NAMES if not wanted or name in wanted]))
        PROFILE.lap("respond", mark)

    def _rerun(self, replies: Replies, index: int, wanted: frozenset[str], rerun: Rerun, rows: list[EmbeddingRow]) -> bool:
        """Run the rows not from the active version again; their results replace them, then
        :meth:`_answer` runs once more. False when the scheduler refuses them (shutting down, queue
        full): the request is then answered with the rows it has, each labelled with its version."""
        active = self.versions.slots.active_version
        stale = [index for index, row in enumerate(rows) if row.version != active]

        def done(_ticket: Ticket, new_rows: list[EmbeddingRow] | None, error: BaseException | None) -> None:
            merged = list(rows)
            for row, value in zip(stale, new_rows or ()):
                merged[row] = value
            # an error here (shutdown) keeps the rows already computed: a mixed answer beats none
            reruns = MAX_VERSION_RERUNS if error else rerun.reruns + 1
            self._answer(replies, index, wanted, dataclasses.replace(rerun, reruns=reruns), None, merged, None)

        ticket = Ticket(len(stale), done, label="version rerun")
        encodings = rerun.encodings
        items = [WorkItem(ticket, k, len(encodings[row].ids), encodings[row], rerun.level) for k, row in enumerate(stale)]
        try:
            self.runner.submit(items, timeout_s=None)
        except Exception:  # queue full or closing: answer with what we have
            return False
        return True

    def release(self) -> None:
        versions = getattr(self, "versions", None)
        if versions is not None:
            versions.close()
