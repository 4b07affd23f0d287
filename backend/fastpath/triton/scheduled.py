"""The base of FastPath's scheduled python-backend models: the ``initialize``/``finalize`` wiring they share.

A model (``models/<name>/model.py``) subclasses :class:`ScheduledModel` and supplies its tensors
(``INPUTS``/``OUTPUTS``), its config classes, and four steps: :meth:`~ScheduledModel.load` (engine,
pipeline, staging pool), :meth:`~ScheduledModel.batch_handler`, :meth:`~ScheduledModel.batch_policy` and
:meth:`~ScheduledModel.warm_up`. The base checks config.pbtxt against the model, parses its parameters
(a parameter the model does not use is refused by name), and owns the scheduler's metrics, runner,
liveness heartbeat and the drain at unload. Request options and answers: :mod:`fastpath.triton.requests`.
Where a new model goes: docs/architecture.md.
"""

from __future__ import annotations

import abc
import gc
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from fastpath.config import parse_sections, triton_parameters
from fastpath.graphs.buckets import Sizes
from fastpath.profiling import PROFILE
from fastpath.scheduling import BatchHandler, BatchPolicy, BatchQueue, BatchRunner, SchedulerObserver
from fastpath.scheduling.config import SchedulerConfig
from fastpath.triton.heartbeat import Progress, start_heartbeat, stub_diagnostics
from fastpath.triton.io import TensorSpec, check_model_io
from fastpath.triton.selftest import run_self_test
from fastpath.triton.watchdog import exit_with_server

LOG = logging.getLogger(__name__)


class ScheduledModel(abc.ABC):
    """A python-backend model whose requests FastPath's scheduler batches; ``N/model.py`` re-exports a
    subclass as ``TritonPythonModel``.

    Class attributes a subclass sets: ``NAME`` (the model's default name), ``CONFIG`` (its parameter
    dataclass), ``SCHEDULER_CONFIG`` (its :class:`SchedulerConfig` subclass, which names the queue
    bound), ``UNIT`` (what a queued item is: ``texts``, ``images``), ``INPUTS``/``OUTPUTS``.

    After :meth:`initialize`: ``config``, ``scheduler_config``, ``model_name``, ``model_version``,
    ``instance_name``, ``progress``, ``pool``, ``metrics``, ``pool_metrics``, ``engine_metrics``, ``handler``, ``runner``.
    """

    NAME: ClassVar[str]
    CONFIG: ClassVar[type]
    SCHEDULER_CONFIG: ClassVar[type[SchedulerConfig]]
    UNIT: ClassVar[str]
    INPUTS: ClassVar[tuple[TensorSpec, ...]]
    OUTPUTS: ClassVar[tuple[TensorSpec, ...]]

    # -- what a model supplies ------------------------------------------------------------------

    @abc.abstractmethod
    def load(self, args: dict[str, str], model_config: dict[str, Any]) -> Sizes:
        """Load the engine and pipeline and create the staging ``pool``; return the scheduler's batch sizes."""

    @abc.abstractmethod
    def batch_handler(self, on_batch: Any) -> BatchHandler:
        """The handler that stages and runs each batch; it calls ``on_batch()`` (if not None) after each."""

    @abc.abstractmethod
    def batch_policy(self, sizes: Sizes) -> BatchPolicy:
        """The queue's batch policy over ``sizes``."""

    @abc.abstractmethod
    def warm_up(self, queue: BatchQueue) -> None:
        """Run a few batches at load (``warmup`` on) to warm the engine and seed ``queue.costs``."""

    def started(self) -> None:
        """Last steps after the warm-up, before the runner starts (none by default)."""

    def runs_queue(self) -> bool:
        """Whether the runner's threads run the queue (True); False when ``execute()`` runs its own batches."""
        return True

    def lanes(self) -> int:
        """Batches the runner runs at once (engine lanes)."""
        return 1

    def engine_stats(self) -> Callable[[], Any] | None:
        """What returns the engine's cumulative copy and run statistics (the fields of
        :data:`fastpath.triton.engine_metrics.COUNTERS`), exported as ``fastpath_engine_*``; None by default."""
        return None

    def release(self) -> None:
        """Release the model's own resources (engine, pipeline) after the drain (none by default)."""

    # -- the shared wiring ----------------------------------------------------------------------

    def initialize(self, args: dict[str, str]) -> None:
        """Self-test the stub, check config.pbtxt against the model, parse its parameters, load the
        model, then build and start its scheduler and liveness heartbeat.

        Raises:
            ConfigError, SelfTestError, ArtifactError, EngineError: the model refuses to load,
                and Triton reports the message.
        """
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        log_filter = stub_diagnostics()  # logging, and stack dumps on a crash or `kill -USR1 <stub pid>`
        run_self_test(pb_utils.Tensor)
        exit_with_server()  # a stub orphaned by a crashed or killed tritonserver exits (watchdog.py)
        model_config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", self.NAME)
        self.model_version = args["model_version"]
        self.instance_name = args.get("model_instance_name", self.model_name)
        check_model_io(model_config, self.INPUTS, self.OUTPUTS, model=self.model_name)
        self.config, self.scheduler_config = parse_sections(triton_parameters(model_config), self.CONFIG,
                                                            self.SCHEDULER_CONFIG, model=self.model_name)
        self.progress = Progress()
        sizes = self.load(args, model_config)
        sched = self.scheduler_config
        self.pool_metrics = pool_metrics(pb_utils, args, [self.pool], sched, self.NAME)
        self.engine_metrics = engine_metrics(pb_utils, args, self.engine_stats(), sched, self.NAME)
        self.metrics = scheduler_metrics(pb_utils, args, sched, self.NAME, sizes)
        self.metrics_flusher, on_metrics = metrics_flusher(sched, self.metrics, [self.pool_metrics, self.engine_metrics],
                                                           self.instance_name)
        self.handler = self.batch_handler(on_metrics)
        queue = BatchQueue(self.batch_policy(sizes), max_items=sched.max_queue_items, unit=self.UNIT)
        self.runner = BatchRunner(queue, self.handler, observer=self.metrics, name=self.model_name, lanes=self.lanes(),
                                  on_delivered=self.progress.advance, **sched.runner_options())
        if sched.warmup:
            self.warm_up(queue)
        PROFILE.reset()  # warm-up and graph capture are not serving
        self.started()
        if self.runs_queue():
            self.runner.start()
        self.heartbeat = start_heartbeat(args, self.progress, sched.stall_timeout_s, on_beat=log_filter.flush)

    def finalize(self) -> None:
        """Stop the heartbeat (an unloading instance is not watched for stalls), drain the scheduler
        (every accepted request gets its response), release staging leases of batches that never
        ran, publish and close the metrics, close the staging pool, :meth:`release`, then write the profile
        (:mod:`fastpath.profiling`). Safe whichever step ``initialize`` reached."""
        heartbeat = getattr(self, "heartbeat", None)
        if heartbeat is not None:
            heartbeat.close()
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close(self.scheduler_config.drain_timeout_s)
        handler = getattr(self, "handler", None)
        if handler is not None and handler.close():
            LOG.warning("released staging leases of batches that never ran (drain timed out)")
        flusher = getattr(self, "metrics_flusher", None)
        if flusher is not None:
            flusher.close()  # the last buffered updates go out before the metrics are dropped
        for name in ("metrics", "pool_metrics", "engine_metrics"):
            closer = getattr(getattr(self, name, None), "close", None)
            if closer is not None:
                closer()
            setattr(self, name, None)
        gc.collect()  # pb_utils metrics must die now, while the stub is still connected (see SchedulerMetrics.close)
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()
        self.release()
        PROFILE.dump(getattr(self, "instance_name", type(self).__name__))  # the phase sums, and the timeline if kept


def scheduler_metrics(pb_utils: Any, args: dict[str, str], sched: SchedulerConfig, default_model: str,
                      batch_sizes: Sequence[int]) -> SchedulerObserver:
    """Scheduler metrics on Triton's metrics port (``batch_sizes``: the scheduler's batch sizes, the batch-size
    histogram's buckets); a no-op observer when the server has metrics off or ``sched.metrics`` is false."""
    from fastpath.triton.metrics import SchedulerMetrics

    if not sched.metrics:
        return SchedulerObserver()
    try:
        return SchedulerMetrics(pb_utils, model=args.get("model_name", default_model), version=args["model_version"],
                                batch_sizes=batch_sizes, buffered=sched.metrics_interval_ms > 0)
    except Exception as exc:  # metrics disabled on the server (--allow-metrics=false): serve anyway
        LOG.warning("FastPath scheduler metrics are off: %s", exc)
        return SchedulerObserver()


def pool_metrics(pb_utils: Any, args: dict[str, str], pools: Sequence[Any], sched: SchedulerConfig, default_model: str) -> Any:
    """:class:`~fastpath.triton.pool_metrics.PoolMetrics` for ``pools``; None when the server has
    metrics off or ``sched.metrics`` is false (each update is a stub-to-server round trip)."""
    from fastpath.triton.pool_metrics import PoolMetrics

    if not sched.metrics:
        return None
    try:
        return PoolMetrics(pb_utils, model=args.get("model_name", default_model), pools=list(pools))
    except Exception as exc:  # metrics disabled on the server: serve anyway
        LOG.warning("FastPath pool metrics are off: %s", exc)
        return None


def engine_metrics(pb_utils: Any, args: dict[str, str], stats: Callable[[], Any] | None, sched: SchedulerConfig,
                   default_model: str) -> Any:
    """:class:`~fastpath.triton.engine_metrics.EngineMetrics` of the engine whose statistics ``stats`` returns;
    None when there is none, the server has metrics off or ``sched.metrics`` is false."""
    from fastpath.triton.engine_metrics import EngineMetrics

    if stats is None or not sched.metrics:
        return None
    try:
        return EngineMetrics(pb_utils, model=args.get("model_name", default_model),
                             device=f"{args.get('model_instance_kind', 'CPU').lower()}:{args.get('model_instance_device_id', '0')}",
                             stats=stats)
    except Exception as exc:  # metrics disabled on the server: serve anyway
        LOG.warning("FastPath engine metrics are off: %s", exc)
        return None


def metrics_flusher(sched: SchedulerConfig, metrics: Any, updated: Sequence[Any], name: str) -> tuple[Any, Any]:
    """How a scheduled model publishes its metrics: ``(flusher, per-batch hook)``.

    ``updated``: exporters with an ``update()`` (pool and engine metrics; None entries are skipped). With
    ``metrics_interval_ms`` > 0 and any metrics on: a :class:`~fastpath.triton.metrics.MetricsFlusher` that
    publishes ``metrics`` and each of ``updated`` every interval, and no per-batch hook. Otherwise: no
    flusher, and a hook that updates each of ``updated`` (None when there is none), which the batch handler
    calls after each batch.
    """
    from fastpath.triton.metrics import MetricsFlusher

    updates = [exporter.update for exporter in updated if exporter is not None]
    flushes = [f for f in (getattr(metrics, "flush", None), *updates) if f is not None]
    if not flushes or sched.metrics_interval_ms <= 0:
        return None, (_call_each(updates) if updates else None)
    return MetricsFlusher(flushes, sched.metrics_interval_ms * 1e-3, name=f"{name}-metrics"), None


def _call_each(updates: list[Callable[[], None]]) -> Callable[[], None]:
    """One hook that runs ``updates`` in order."""

    def update_all() -> None:
        for update in updates:
            update()

    return update_all

