"""FastPath's share of a request's time after ``execute()`` returned, from the server's ``/metrics``.

Triton's statistics API times a request until the model's ``execute()`` returns. A FastPath model
in sender mode returns at once and answers later from its scheduler's threads, so the time a text
then waits in FastPath's queue and runs in its batch is in none of Triton's phases: a bench that took
the rest of the latency for "client + network" put ~30 of 32 ms there at concurrency 8. FastPath
publishes that time on Triton's metrics port (``fastpath.triton.metrics``), per text and with
``path="queued"`` for exactly these texts (``path="inline"`` ones ran inside ``execute()``, already in
Triton's ``compute_infer``):

- ``fastpath_queue_duration_seconds_total``: accept to dispatch, summed over texts;
- ``fastpath_text_execution_seconds_total``: the engine time of each text's batch, summed over texts.

Their increase between two scrapes, over the texts Triton counted (``inference_count``), is the mean
per text, which is the mean per request when a request's texts share a batch (always for one text
per request; for several a lower bound, as a request waits for its slowest text). FastPath publishes
every ``metrics_interval_ms`` (500 ms), so a scrape trails the requests by up to that long.
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from collections.abc import Mapping

FAMILIES = {"queue": "fastpath_queue_duration_seconds_total", "batch_run": "fastpath_text_execution_seconds_total"}
PHASES = tuple(FAMILIES)


def queued_seconds(exposition: str, model: str) -> dict[str, float]:
    """Seconds summed over the ``path="queued"`` texts of ``model`` for each phase of :data:`FAMILIES`.

    Args:
        exposition: a ``/metrics`` page (Prometheus text format).
        model: the ``model`` label to sum (every version and stub ``pid``).

    Returns:
        ``{"queue": s, "batch_run": s}``; 0.0 for a family the page lacks (no text ran yet).

    Raises:
        ImportError: prometheus-client is missing (the message says which extra installs it).
        ValueError: the page is not in the Prometheus text format.
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise ImportError("reading FastPath's metrics needs prometheus-client: pip install 'fastpath[plots]'") from exc
    wanted = {name: phase for phase, name in FAMILIES.items()}
    totals = dict.fromkeys(PHASES, 0.0)
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            phase = wanted.get(sample.name)
            if phase and sample.labels.get("model") == model and sample.labels.get("path") == "queued":
                totals[phase] += sample.value
    return totals


async def scrape(metrics_url: str, timeout_s: float = 10.0) -> str:
    """The ``/metrics`` page of Triton's metrics port at ``metrics_url`` (``host:port``), read on a thread.

    Raises:
        OSError: the port did not answer (``urllib.error.URLError`` is one).
    """
    def read() -> str:
        with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=timeout_s) as reply:
            return reply.read().decode("utf-8", "replace")

    return await asyncio.to_thread(read)


def per_request_us(before: Mapping[str, float], after: Mapping[str, float], texts: int) -> dict[str, float]:
    """Mean microseconds per request of each phase between two :func:`queued_seconds` snapshots.

    Args:
        before, after: the snapshots at the start and the end of the reported windows.
        texts: texts Triton counted over the same windows (its ``inference_count`` delta).

    Returns:
        ``{"fastpath_queue_us": ..., "fastpath_batch_run_us": ...}``; NaN when ``texts`` is 0.
    """
    return {f"fastpath_{phase}_us": (after[phase] - before[phase]) / texts * 1e6 if texts else math.nan
            for phase in PHASES}
