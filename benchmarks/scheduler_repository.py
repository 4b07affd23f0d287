"""The model repository of the CPU scheduler benchmarks (scheduler_cpu.py, serving_cpu.py): FastPath's shipped
text_embedding, its A/B variants (:data:`FASTPATH_VARIANTS`), the served baselines of benchmarks/models, and
optionally the package of another git ref (``text_embedding_ref``), every artifact linked from
model_repository/text_embedding.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from config_text import with_parameter  # benchmarks/config_text.py (the importer puts benchmarks/ on sys.path)

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "model_repository" / "text_embedding" / "1"
BASELINES = REPO / "benchmarks" / "models"
# what each version directory links: the served files and the manifest and golden set FastPath verifies them by
VERSION_FILES = ("model.onnx", "tokenizer.json", "manifest.json", "golden.npz")
SERVED = {"naive": "naive_embedding", "stack_pad": "stack_pad_embedding", "fastpath": "text_embedding",
          "echo": "echo_embedding", "fastpath_return": "text_embedding_rt", "fastpath_return_2x1": "text_embedding_rt2x1",
          "fastpath_2x1": "text_embedding_2x1", "fastpath_nospin": "text_embedding_ns", "fastpath_int8": "text_embedding_int8",
          "fastpath_1lane": "text_embedding_1lane", "fastpath_lanes3": "text_embedding_l3",
          "fastpath_noinline": "text_embedding_noinline", "fastpath_nobatcher": "text_embedding_nb",
          "fastpath_nocancel": "text_embedding_nc", "fastpath_nometrics": "text_embedding_nm",
          "fastpath_cancelask_all": "text_embedding_cc0", "fastpath_ref": "text_embedding_ref"}
# FastPath variants (--variants), each the shipped config (one instance, engine lanes, response senders,
# Triton's batcher at 0 us) changed as listed: model name -> (FastPath parameters to set, instance count,
# Triton dynamic batcher delay in us or None for none, the model_repository/text_embedding version whose
# model.onnx it serves)
FASTPATH_VARIANTS = {
    # execute() runs its requests' batches and returns the responses; Triton's batcher hands it the queue
    "text_embedding_rt": ({"response_mode": "return"}, 1, 0, "1"),
    # the throughput configuration of docs/deployment.md: return mode on two instances of one ONNX Runtime thread
    "text_embedding_rt2x1": ({"response_mode": "return", "intra_op_threads": "1"}, 2, 0, "1"),
    "text_embedding_2x1": ({"intra_op_threads": "1", "concurrent_batches": "1"}, 2, 0, "1"),  # sender mode, two one-thread instances
    "text_embedding_ns": ({"intra_op_spinning": "false"}, 1, 0, "1"),  # ONNX Runtime workers sleep between operators
    "text_embedding_int8": ({}, 1, 0, "2"),  # the INT8 QDQ build (make test / make serve build version 2)
    # one batch at a time on one ONNX Runtime session of every thread (no engine lanes)
    "text_embedding_1lane": ({"concurrent_batches": "1"}, 1, 0, "1"),
    "text_embedding_l3": ({"concurrent_batches": "3"}, 1, 0, "1"),  # three one-thread lanes on two cores
    # the scheduler threads answer every request, also a lone one (no inline execute when idle)
    "text_embedding_noinline": ({"inline_when_idle": "false"}, 1, 0, "1"),
    "text_embedding_nb": ({}, 1, None, "1"),  # no Triton batcher in front: one request per execute() call
    "text_embedding_nc": ({"check_cancellation": "false"}, 1, 0, "1"),  # no is_cancelled() probe per request
    # an is_cancelled() probe for every request, however briefly it waited
    "text_embedding_cc0": ({"cancel_check_after_us": "0"}, 1, 0, "1"),
    "text_embedding_nm": ({"metrics": "false"}, 1, 0, "1"),  # no custom metrics
}


def config_variant(config: str, name: str, parameters: dict[str, str], instances: int, delay_us: int | None) -> str:
    """The shipped text_embedding config.pbtxt text renamed to ``name``, with ``parameters`` set
    (replaced or added), ``instances`` instances and Triton's dynamic batcher at ``delay_us`` (None: off)."""
    config = config.replace('name: "text_embedding"', f'name: "{name}"')
    config = re.sub(r"count: \d+", f"count: {instances}", config)
    config = re.sub(r"^dynamic_batching \{[^}]*\}\n", "", config, flags=re.M)
    for key, value in parameters.items():
        config = with_parameter(config, key, value)
    return config + (f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n" if delay_us is not None else "")


def reference_model(repository: Path, root: Path, ref: str) -> None:
    """Model ``text_embedding_ref``: the shipped text_embedding served by the FastPath package of git ``ref``.

    ``git archive`` extracts the ref's ``backend/`` and text_embedding config under ``root``; the model's
    ``model.py`` puts that ``backend/`` first on ``sys.path`` (each model instance is its own stub
    process, so only this model's stubs import the older package). Artifacts are linked, as for the others.
    """
    tree = root / "ref"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "backend", "model_repository/text_embedding"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    version = repository / "text_embedding_ref" / "1"
    version.mkdir(parents=True)
    config = (tree / "model_repository" / "text_embedding" / "config.pbtxt").read_text()
    (version.parent / "config.pbtxt").write_text(config.replace('name: "text_embedding"', 'name: "text_embedding_ref"'))
    (version / "model.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tree / 'backend')!r})\nimport fastpath  # noqa: E402\n"
        f"assert fastpath.__file__.startswith({str(tree)!r}), f'fastpath_ref imported {{fastpath.__file__}}'\n"
        "from fastpath.models.text_embedding.model import TextEmbeddingModel as TritonPythonModel  # noqa: E402,F401\n")
    for artifact in VERSION_FILES:
        (version / artifact).symlink_to(ARTIFACTS / artifact)


def build_repository(root: Path, ref: str | None = None) -> Path:
    """A model repository with FastPath's text_embedding and the baselines, artifacts linked in (and
    ``text_embedding_ref``, the package at git ``ref``, when given)."""
    repository = root / "repository"
    sources = {"text_embedding": REPO / "model_repository" / "text_embedding"}
    sources.update({name: BASELINES / name for name in ("naive_embedding", "stack_pad_embedding", "echo_embedding",
                                                         "raw_engine_bench")})
    for name, source in sources.items():
        version = repository / name / "1"
        version.mkdir(parents=True)
        shutil.copy(source / "config.pbtxt", repository / name / "config.pbtxt")
        (version / "model.py").symlink_to(source / "1" / "model.py")
        for artifact in VERSION_FILES:
            (version / artifact).symlink_to(ARTIFACTS / artifact)
    for name, (parameters, instances, delay_us, version) in FASTPATH_VARIANTS.items():
        shutil.copytree(repository / "text_embedding", repository / name, symlinks=True)
        if version != "1" and (ARTIFACTS.parent / version / "model.onnx").exists():
            for artifact in VERSION_FILES:  # that version's model with its own manifest and golden set
                (repository / name / "1" / artifact).unlink()
                (repository / name / "1" / artifact).symlink_to(ARTIFACTS.parent / version / artifact)
        shipped = (repository / "text_embedding" / "config.pbtxt").read_text()
        (repository / name / "config.pbtxt").write_text(config_variant(shipped, name, parameters, instances, delay_us))
    if ref is not None:
        reference_model(repository, root, ref)
    return repository
