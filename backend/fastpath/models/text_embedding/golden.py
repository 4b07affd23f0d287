"""Golden inputs stored with a model version, and the validation gate a standby slot must pass.

``golden.npz`` holds ``texts`` (unicode [N]) and ``embeddings`` (float32 [N, 384]) computed by the
fp32 reference; the version's manifest states the tolerance as ``golden.min_cosine`` (fp32 0.9999,
int8 0.99: the INT8 accuracy gate), and may state another for a runtime whose artifact differs under
``golden.min_cosine_by_runtime`` (version 2 under ``torch``: its bf16 weights, 0.999). The gate also
checks that the engine's inputs and outputs agree with the model config: three int64 inputs with
dynamic batch and sequence dimensions, one float32 output of width 384.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.engines import load_engine
from fastpath.errors import ArtifactError, ConfigError
from fastpath.manifest import ChecksumCache, external_data_artifact, read_manifest, verify_manifest, write_manifest
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.pipeline import EMBEDDING_DIM, TextEmbedder, engine_options, padded_length
from fastpath.text import TextTokenizer

GOLDEN_NAME = "golden.npz"
GOLDEN_TEXTS = (
    "hello world",
    "",
    "A sentence-embedding model maps text to a 384-dimensional vector.",
    "Triton Inference Server serves models over HTTP and gRPC.",
    " 😃 naïve café 的人有",
    "word " * 300,
)
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# runtimes whose manifest entry's ``precision`` is the engine's (the tensorrt entries describe a plan build in words)
ENTRY_PRECISION_RUNTIMES = ("torch",)


def write_golden(version_dir: Path, texts: tuple[str, ...], embeddings: np.ndarray) -> Path:
    """Store golden texts and their reference embeddings (float32 [N, 384]) in ``version_dir``."""
    path = version_dir / GOLDEN_NAME
    np.savez(path, texts=np.asarray(texts, dtype=np.str_), embeddings=np.asarray(embeddings, dtype=np.float32))
    return path


def check_engine_io(embedder: TextEmbedder) -> None:
    """Refuse an engine whose tensors disagree with text_embedding's config.

    Raises:
        ArtifactError: listing the engine's input/output shapes against what the config needs.
    """
    inputs = {spec.name: spec for spec in embedder.engine.inputs}
    outputs = embedder.engine.outputs
    problems = []
    for name in INPUT_NAMES:
        spec = inputs.get(name)
        if spec is None:
            problems.append(f"input {name} missing")
        elif spec.dtype != np.int64 or len(spec.shape) != 2 or spec.shape[0] != -1 or spec.shape[1] != -1:
            problems.append(f"input {name} is {spec.dtype}{list(spec.shape)}, config needs int64[-1, -1] (dynamic batch and sequence)")
    if len(outputs) != 1 or outputs[0].dtype != np.float32 or outputs[0].shape[-1] != EMBEDDING_DIM:
        problems.append(f"outputs are {[(o.name, str(o.dtype), list(o.shape)) for o in outputs]}, config needs one float32[-1, {EMBEDDING_DIM}]")
    if problems:
        raise ArtifactError("incompatible with the model config (EMBEDDING FP32 [384], batching on): " + "; ".join(problems))


def _version_config(manifest: dict[str, Any], base: TextEmbeddingConfig, version_dir: Path) -> TextEmbeddingConfig:
    """``base`` with the version's artifact for ``base.runtime``.

    ONNX Runtime: the manifest's artifact and precision, and the artifact's current external-data
    copy when listed (the same tensors, mapped from a file: 3x faster to load). Other runtimes (the
    torch runtime of the GPU configuration): the file the manifest lists for that runtime under
    ``artifacts`` (version 1's ``model.fp16.safetensors``, version 2's ``model.bf16.safetensors``), at the
    precision that entry gives for the torch runtime (fp16, bf16), else the config's; the config's
    artifact when the manifest has no ``artifacts`` table.

    Raises:
        ArtifactError: the manifest's ``artifacts`` table has no entry for ``base.runtime`` (a version
            built for another runtime), or its entry's precision is not one the config takes.
    """
    if base.runtime == "onnxruntime":
        artifact = manifest.get("artifact", base.artifact)
        artifact = external_data_artifact(manifest, artifact) or artifact
        return dataclasses.replace(base, artifact=artifact, precision=manifest.get("precision", base.precision))
    listed = manifest.get("artifacts") or {}
    if not listed:
        return base
    if base.runtime not in listed:
        raise ArtifactError(f"{version_dir / 'manifest.json'} lists no artifact for runtime {base.runtime!r} (it lists "
                            f"{', '.join(sorted(listed))}); the serving configuration runs {base.runtime!r}: expected a "
                            "version built for it")
    entry = listed[base.runtime]
    precision = entry.get("precision", base.precision) if base.runtime in ENTRY_PRECISION_RUNTIMES else base.precision
    try:
        return dataclasses.replace(base, artifact=entry["file"], precision=precision)
    except ConfigError as exc:
        raise ArtifactError(f"{version_dir / 'manifest.json'} lists {entry['file']} for runtime {base.runtime!r} at "
                            f"precision {precision!r}, which the engine does not take ({exc}); rebuild it with "
                            "'fastpath build'") from None


def golden_min_cosine(manifest: dict[str, Any], runtime: str) -> float:
    """The golden gate of a version under ``runtime``: ``golden.min_cosine_by_runtime[runtime]`` when the
    manifest states one (that runtime's artifact is not the one ``min_cosine`` gates), else ``golden.min_cosine``.

    Raises:
        KeyError: the manifest states neither (:func:`validate_text_version` checks for ``min_cosine`` first).
    """
    golden_spec = manifest["golden"]
    return float((golden_spec.get("min_cosine_by_runtime") or {}).get(runtime, golden_spec["min_cosine"]))


def _check_same_tokenizer(version_dir: Path, manifest: dict[str, Any], config: TextEmbeddingConfig, sha256: str) -> None:
    if manifest["files"].get(config.tokenizer) != sha256:
        raise ArtifactError(
            f"{version_dir / config.tokenizer} differs from the serving version's tokenizer; queued requests are already "
            "tokenized, so a live swap needs the same tokenizer (load a new tokenizer through Triton's model load instead)"
        )


def verify_loaded_files(version_dir: Path, manifest: dict[str, Any], config: TextEmbeddingConfig, *,
                        checksums: ChecksumCache | None = None) -> None:
    """Verify (size and sha256) the files of a version that ``config``'s runtime loads: its artifact (for
    ONNX Runtime's external copy also its data file and its source ``model.onnx``), the tokenizer and
    ``golden.npz``. Files for other runtimes may be absent: a GPU host may carry only the torch runtime's
    files of a version.

    Raises:
        ArtifactError: a loaded file not listed in the manifest, missing, or not matching it.
    """
    external = manifest.get("external_data") or {}
    needed = {config.artifact, config.tokenizer} | ({GOLDEN_NAME} & set(manifest.get("files") or ()))
    if external.get("file") == config.artifact:  # the copy is current only against its source's listed sha256
        needed.update(str(external[key]) for key in ("data", "source") if external.get(key))
    verify_manifest(version_dir, required=sorted(needed), only_required=True, checksums=checksums)


def load_text_version(model_dir: Path, version: int, base: TextEmbeddingConfig, *, checksums: ChecksumCache | None = None,
                      timings: dict[str, float] | None = None,
                      serving_tokenizer: tuple[TextTokenizer, str] | None = None) -> TextEmbedder:
    """Verify a version's manifest and load its engine, warmed up on one short batch.

    The artifact file and precision come from the manifest; ONNX Runtime loads the artifact's external-data copy
    when the manifest lists a current one (:func:`fastpath.manifest.external_data_artifact`). The long shapes are
    warmed by the golden check (:func:`validate_text_version`), which runs before the version serves.

    Args:
        model_dir, version: the model's directory in the model repository; the version directory to load.
        base: the serving config (artifact and precision are replaced by the manifest's).
        checksums: digests of files verified before and unchanged since (None: hash every file).
        timings: if given, receives ``verify_s``, ``engine_load_s`` and ``warmup_s`` (seconds).
        serving_tokenizer: the serving version's tokenizer and the sha256 of its ``tokenizer.json``. The version
            must list the same file (queued requests are already tokenized); the tokenizer object (no per-call
            state) is then shared instead of loaded again.

    Raises:
        ArtifactError: missing directory, manifest or file, a checksum mismatch, or another tokenizer.
        EngineError: the artifact does not load, or an engine lane disagrees with the main session.
    """
    timings = {} if timings is None else timings
    version_dir = model_dir / str(version)
    if not version_dir.is_dir():
        raise ArtifactError(f"{version_dir} does not exist")
    started = time.perf_counter()
    manifest = read_manifest(version_dir)
    config = _version_config(manifest, base, version_dir)
    verify_loaded_files(version_dir, manifest, config, checksums=checksums)
    verified = time.perf_counter()
    if serving_tokenizer is None:
        embedder = TextEmbedder.from_directory(version_dir, config)
    else:
        _check_same_tokenizer(version_dir, manifest, config, serving_tokenizer[1])
        engine = load_engine(config.runtime, str(version_dir / config.artifact), **engine_options(config))
        embedder = TextEmbedder(engine, serving_tokenizer[0], config)
    loaded = time.perf_counter()
    try:
        check_engine_io(embedder)  # before running anything: a fixed-shape ONNX must fail with the shapes named
    except ArtifactError:
        embedder.close()
        raise
    try:
        embedder.embed(["warm " * 8] * 4)  # the first run pays ONNX Runtime's lazy initialization
        embedder.check_lanes()  # and so does each engine lane's; each must match the main session
    except Exception:
        embedder.close()
        raise
    timings.update(verify_s=verified - started, engine_load_s=loaded - verified, warmup_s=time.perf_counter() - loaded)
    return embedder


def embed_by_length(embedder: TextEmbedder, texts: list[str]) -> np.ndarray:
    """Embed ``texts`` with one engine call per length bucket, as the scheduler batches them.

    ``TextEmbedder.embed`` pads a batch to its longest text: the golden set's one 256-token text
    would pad the five short ones to 256 too (fp32 on 2 cores: 0.37 s, against 0.08 s this way).

    Returns:
        float32 [len(texts), 384], in input order.
    """
    encodings = embedder.tokenizer.encode(texts)
    config = embedder.config
    groups: dict[int, list[int]] = {}
    for index, encoding in enumerate(encodings):
        length = padded_length(len(encoding.ids), config.length_buckets_tokens, config.max_seq_length)
        groups.setdefault(length, []).append(index)
    embeddings = np.empty((len(texts), EMBEDDING_DIM), dtype=np.float32)
    for indices in groups.values():
        for start in range(0, len(indices), config.max_batch_texts):
            chunk = indices[start : start + config.max_batch_texts]
            embeddings[chunk] = embedder.run_encodings([encodings[i] for i in chunk])
    return embeddings


def validate_text_version(embedder: TextEmbedder, version_dir: Path, *, checksums_verified: bool = False) -> float:
    """The validation gate: engine I/O matches the config, golden outputs within the stated tolerance.

    Args:
        embedder: the loaded standby version.
        version_dir: its version directory (manifest and ``golden.npz``).
        checksums_verified: the caller verified the manifest's checksums (skip hashing again).

    Returns:
        The minimum cosine to the golden embeddings.

    Raises:
        ArtifactError: no golden file/tolerance, shapes disagree, or an output is off (value and tolerance named).
    """
    check_engine_io(embedder)
    manifest = read_manifest(version_dir)
    if not checksums_verified:  # load_text_version hashed the files it loads moments ago
        verify_loaded_files(version_dir, manifest, embedder.config)
    if GOLDEN_NAME not in manifest.get("files", {}) or "min_cosine" not in (manifest.get("golden") or {}):
        raise ArtifactError(f"{version_dir} has no golden inputs with a stated tolerance; rebuild it with 'fastpath build'")
    tolerance = golden_min_cosine(manifest, embedder.config.runtime)
    with np.load(version_dir / GOLDEN_NAME, allow_pickle=False) as golden:
        texts, expected = [str(t) for t in golden["texts"]], golden["embeddings"]
    got = embed_by_length(embedder, texts)
    if got.shape != expected.shape or not np.isfinite(got).all():
        raise ArtifactError(f"golden outputs have shape {got.shape} (finite: {bool(np.isfinite(got).all())}); expected {expected.shape}")
    cosine = (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    worst = float(cosine.min())
    if worst < tolerance:
        raise ArtifactError(
            f"golden check failed: cosine {worst:.5f} on {texts[int(cosine.argmin())][:40]!r} is below the version's "
            f"tolerance {tolerance} for {embedder.config.artifact} ({embedder.config.runtime}, {embedder.config.precision})"
        )
    return worst


def add_golden(version_dir: Path, reference: TextEmbedder, *, min_cosine: float) -> Path:
    """Compute golden embeddings with the fp32 ``reference`` and record them in the version's manifest.

    Args:
        version_dir: a built version directory with a manifest.
        reference: the fp32 embedder whose outputs are the truth.
        min_cosine: the version's stated tolerance (fp32: 0.9999; int8: 0.99).

    Returns:
        The golden file path.
    """
    path = write_golden(version_dir, GOLDEN_TEXTS, reference.embed(list(GOLDEN_TEXTS)).embeddings)
    manifest = read_manifest(version_dir)
    files = set(manifest.pop("files", {})) | {GOLDEN_NAME}
    manifest["golden"] = {"file": GOLDEN_NAME, "texts": len(GOLDEN_TEXTS), "min_cosine": min_cosine}
    write_manifest(version_dir, files, manifest)
    return path
