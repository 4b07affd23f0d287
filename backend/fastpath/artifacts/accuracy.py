"""Accuracy of a built artifact against its fp32 reference on held-out real text, and the gate.

The measure is the cosine similarity between the candidate's and the reference's embedding of the
same text (both are unit vectors, so it is their dot product). The INT8 gate: minimum
cosine >= 0.99 and mean cosine >= 0.995 over the evaluation split of :mod:`fastpath.text.corpus`, which
never overlaps the calibration text; a model below either bound fails the build with a message
saying by how much.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from fastpath.errors import AccuracyGateError, ArtifactError

MIN_COSINE = 0.99
MEAN_COSINE = 0.995


@dataclasses.dataclass(frozen=True, kw_only=True)
class AccuracyReport:
    """Cosine similarity of candidate vs reference embeddings over a set of texts.

    Attributes:
        reference: what the candidate is compared with (e.g. ``"version 1 model.onnx (fp32)"``).
        candidate: what was measured (e.g. ``"model.onnx (int8 QDQ)"``).
        split: which text (e.g. ``"pydoc evaluation split"``).
        texts: number of texts.
        min_cosine, mean_cosine, p01_cosine: minimum, mean and 1st percentile of the cosines.
        worst_text: the first 80 characters of the text with the lowest cosine.
        required_min_cosine, required_mean_cosine: the gate's bounds.
    """

    reference: str
    candidate: str
    split: str
    texts: int
    min_cosine: float
    mean_cosine: float
    p01_cosine: float
    worst_text: str
    required_min_cosine: float = MIN_COSINE
    required_mean_cosine: float = MEAN_COSINE

    @property
    def passed(self) -> bool:
        """True when both bounds hold."""
        return self.min_cosine >= self.required_min_cosine and self.mean_cosine >= self.required_mean_cosine

    def shortfalls(self) -> list[str]:
        """One line per failed bound, with the gap."""
        lines = []
        if self.min_cosine < self.required_min_cosine:
            lines.append(f"min cosine {self.min_cosine:.4f} < {self.required_min_cosine} (short by {self.required_min_cosine - self.min_cosine:.4f}; worst text: {self.worst_text!r})")
        if self.mean_cosine < self.required_mean_cosine:
            lines.append(f"mean cosine {self.mean_cosine:.4f} < {self.required_mean_cosine} (short by {self.required_mean_cosine - self.mean_cosine:.4f})")
        return lines

    def to_dict(self) -> dict:
        """JSON-ready dict (for manifest.json), with ``passed``."""
        return {**dataclasses.asdict(self), "passed": self.passed}


def cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two float [N, D] arrays.

    Raises:
        ArtifactError: the shapes differ, or an embedding is NaN/Inf or zero.
    """
    if reference.shape != candidate.shape:
        raise ArtifactError(f"embeddings of shape {candidate.shape} cannot be compared with reference {reference.shape}")
    ref = reference.astype(np.float64)
    cand = candidate.astype(np.float64)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    if not np.all(np.isfinite(cand)) or np.any(norms == 0):
        raise ArtifactError("candidate embeddings contain NaN/Inf or zero vectors")
    return np.sum(ref * cand, axis=1) / norms


def report(reference: np.ndarray, candidate: np.ndarray, texts: Sequence[str], *, reference_name: str, candidate_name: str,
           split: str, min_cosine: float = MIN_COSINE, mean_cosine: float = MEAN_COSINE) -> AccuracyReport:
    """Compare embeddings of ``texts`` (row i = texts[i]) and summarize."""
    values = cosines(reference, candidate)
    return AccuracyReport(
        reference=reference_name,
        candidate=candidate_name,
        split=split,
        texts=len(texts),
        min_cosine=round(float(values.min()), 6),
        mean_cosine=round(float(values.mean()), 6),
        p01_cosine=round(float(np.percentile(values, 1)), 6),
        worst_text=texts[int(values.argmin())][:80],
        required_min_cosine=min_cosine,
        required_mean_cosine=mean_cosine,
    )


def check_gate(result: AccuracyReport) -> AccuracyReport:
    """Return ``result`` if it passes; otherwise raise.

    Raises:
        AccuracyGateError: naming the candidate, the number of texts and each bound's shortfall.
    """
    if not result.passed:
        raise AccuracyGateError(
            f"{result.candidate} fails the accuracy gate against {result.reference} on {result.texts} texts "
            f"({result.split}): " + "; ".join(result.shortfalls())
        )
    return result


def embed_batches(run: Callable[[dict[str, np.ndarray]], np.ndarray], batches: Iterable[dict[str, np.ndarray]]) -> np.ndarray:
    """Concatenate ``run(feeds)`` over batches: float32 [N, D]."""
    return np.concatenate([np.asarray(run(feeds), dtype=np.float32) for feeds in batches])


def reports_by_kind(kinds: Mapping[str, Sequence[str]], reference: np.ndarray, candidate: np.ndarray, *, reference_name: str,
                    candidate_name: str, label: str, min_cosine: float = MIN_COSINE,
                    mean_cosine: float = MEAN_COSINE) -> dict[str, AccuracyReport]:
    """One report per kind, each held to the bounds on its own (a good mean on one kind cannot hide another).

    Args:
        kinds: texts by kind; ``reference`` and ``candidate`` hold their embeddings, float [N, D], in this order.
        label: the text set's name; each report's split is ``"<label>: <kind>"``.
    """
    reports, start = {}, 0
    for kind, texts in kinds.items():
        end = start + len(texts)
        reports[kind] = report(reference[start:end], candidate[start:end], texts, reference_name=reference_name,
                               candidate_name=candidate_name, split=f"{label}: {kind}", min_cosine=min_cosine,
                               mean_cosine=mean_cosine)
        start = end
    return reports


def shortfalls_by_kind(reports: Mapping[str, AccuracyReport]) -> list[str]:
    """``"<kind>: <shortfalls>"`` for each failing report (empty when all pass)."""
    return [f"{kind}: " + "; ".join(result.shortfalls()) for kind, result in reports.items() if not result.passed]
