"""``fastpath build``: versioned model artifacts in the model repository.

    fastpath build                      fp32 version of text_embedding (1) + text_detection
    fastpath build --if-missing         the same, skipping versions whose manifest verifies (make serve/test)
    fastpath build --int8               also text_embedding version 2: INT8 (ONNX Runtime) and bf16 (torch runtime),
                                        each behind its accuracy gate
    fastpath build --verify             check every version's manifest (sizes and sha256); exit 1 on a problem

Layout (docs/design/engines.md): ``text_embedding/1`` holds ``model.onnx`` (fp32),
``model.fp16.safetensors`` (torch runtime), ``tokenizer.json``, ``golden.npz`` and ``manifest.json``;
``text_embedding/2`` holds ``model.onnx`` (INT8 QDQ), ``model.bf16.safetensors`` (torch runtime: the fp32
weights cast to bf16, :mod:`fastpath.artifacts.bf16`), ``tokenizer.json``, ``golden.npz``, ``model.py`` and
``manifest.json``. Both also hold ``model.external.onnx`` + ``.data``: the same model with its weights in ONNX
external data, which ONNX Runtime loads 3x faster for live swaps (:mod:`fastpath.artifacts.external_data`;
made from the verified ``model.onnx``). ``--if-missing`` adds the external-data copy and the bf16 weights to
versions built before them, without exporting or quantizing again. A failed build publishes nothing and
exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from fastpath.cli.common import DEFAULT_REPOSITORY, bounded
from fastpath.errors import ArtifactError

LOG = logging.getLogger("fastpath")

FP32_REQUIRED = ("model.onnx", "model.fp16.safetensors", "tokenizer.json", "golden.npz")
INT8_REQUIRED = ("model.onnx", "tokenizer.json", "golden.npz", "model.py")
# the options only the INT8 build reads, with their defaults (a value other than its default needs --int8)
INT8_DEFAULTS = {"calibration_texts": 256, "validation_texts": 256, "evaluation_texts": None}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``build`` command to the ``fastpath`` parser."""
    from fastpath.cli.common import plain_help

    build = subparsers.add_parser("build", help="build versioned model artifacts into the model repository",
                                  description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    build.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY,
                       help=f"the Triton model repository to build into (default: {DEFAULT_REPOSITORY})")
    build.add_argument("--if-missing", action="store_true", help="skip versions whose manifest verifies")
    build.add_argument("--int8", action="store_true", help="also build text_embedding version 2 (INT8 QDQ, and bf16 weights for the torch runtime)")
    sentences = bounded(int, 1, False, "a number of sentences, 1 or more")
    build.add_argument("--calibration-texts", type=sentences, default=INT8_DEFAULTS["calibration_texts"],
                       help="calibration-split sentences for INT8 calibration")
    build.add_argument("--validation-texts", type=sentences, default=INT8_DEFAULTS["validation_texts"],
                       help="further calibration-split sentences to choose a recipe")
    build.add_argument("--evaluation-texts", type=sentences, default=INT8_DEFAULTS["evaluation_texts"],
                       help="evaluation-split sentences for the gate (default: all)")
    build.add_argument("--verify", action="store_true", help="only verify every version's manifest")
    build.set_defaults(func=cmd_build)


def _complete(version_dir: Path, required: tuple[str, ...]) -> bool:
    """True when the version's manifest verifies and lists every required file."""
    from fastpath.manifest import MANIFEST_NAME, verify_manifest

    try:
        verify_manifest(version_dir, required=required)
    except ArtifactError as exc:
        if not (version_dir / MANIFEST_NAME).exists():  # a fresh clone: nothing built yet, nothing to warn about
            LOG.info("building %s: it has no %s yet", version_dir, MANIFEST_NAME)
        else:
            LOG.warning("rebuilding %s: %s", version_dir, exc)
        return False
    return True


def verify_repository(repository: Path) -> int:
    """Verify the manifest of every numbered version directory; return the number of failures (a model
    repository that is missing or holds no version directory counts as one: there was nothing to verify)."""
    from fastpath.manifest import verify_manifest

    failures = 0
    version_dirs = sorted(p for p in repository.glob("*/*") if p.is_dir() and p.name.isdigit())
    if not version_dirs:
        LOG.error("--model-repository %s: %s", repository, "holds no version directory (<model>/<number>/): nothing to verify"
                  if repository.is_dir() else "is not a directory")
        return 1
    for version_dir in version_dirs:
        if not (version_dir / "manifest.json").exists():
            LOG.info("%s: no manifest (not built)", version_dir)
            continue
        try:
            manifest = verify_manifest(version_dir)
            LOG.info("%s: ok (%s, %d files)", version_dir, manifest.get("precision", "?"), len(manifest["files"]))
        except ArtifactError as exc:
            failures += 1
            LOG.error("%s", exc)
    return failures


def _add_external_data(version_dir: Path) -> None:
    """List the external-data copy of ``model.onnx`` that swaps load 3x faster (fastpath.artifacts.external_data)."""
    from fastpath.artifacts.external_data import GRAPH_NAME, add_external_data_copy

    if add_external_data_copy(version_dir):
        LOG.info("wrote %s (model.onnx with its weights in external data, for fast loads)", version_dir / GRAPH_NAME)


def _int8_current(int8_dir: Path, fp32_dir: Path) -> bool:
    """True when version 2 verifies and was quantized from version 1's current model.onnx."""
    from fastpath.manifest import read_manifest

    if not _complete(int8_dir, INT8_REQUIRED):
        return False
    built_from = read_manifest(int8_dir).get("source", {}).get("model.onnx_sha256")
    if built_from == read_manifest(fp32_dir)["files"]["model.onnx"]:
        return True
    LOG.warning("rebuilding %s: it was quantized from another fp32 model.onnx", int8_dir)
    return False


def _build_text_embedding(args: argparse.Namespace) -> None:
    from fastpath.artifacts.export import export_text_embedding

    model_dir = args.model_repository / "text_embedding"
    fp32_dir = model_dir / "1"
    if args.if_missing and _complete(fp32_dir, FP32_REQUIRED):
        LOG.info("text_embedding version 1 (fp32) present and verified in %s", fp32_dir)
    else:
        LOG.info("exporting all-MiniLM-L6-v2 (fp32 ONNX + fp16 torch weights) into %s", fp32_dir)
        path = export_text_embedding(fp32_dir)
        LOG.info("wrote %s (%.1f MB)", path, path.stat().st_size / 1e6)
    _add_external_data(fp32_dir)
    if not args.int8:
        return
    from fastpath.artifacts.int8 import build_int8_version

    int8_dir = model_dir / "2"
    if args.if_missing and _int8_current(int8_dir, fp32_dir):
        LOG.info("text_embedding version 2 (int8) present and verified in %s", int8_dir)
    else:
        LOG.info("quantizing version 1 to INT8 QDQ into %s", int8_dir)
        published = build_int8_version(model_dir, calibration_texts=args.calibration_texts,
                                       validation_texts=args.validation_texts, evaluation_texts=args.evaluation_texts)
        LOG.info("wrote %s (%.1f MB)", published / "model.onnx", (published / "model.onnx").stat().st_size / 1e6)
    _add_external_data(int8_dir)
    _add_bf16_weights(model_dir)


def _add_bf16_weights(model_dir: Path) -> None:
    """List version 2's torch-runtime artifact, the fp32 weights cast to bf16 (fastpath.artifacts.bf16)."""
    from fastpath.artifacts.bf16 import BF16_ARTIFACT, add_bf16_weights

    if add_bf16_weights(model_dir):
        LOG.info("wrote %s (bf16 weights for the torch runtime)", model_dir / "2" / BF16_ARTIFACT)
    else:
        LOG.info("text_embedding version 2 bf16 weights (torch runtime) present and verified")


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def cmd_build(args: argparse.Namespace) -> int:
    """Run ``fastpath build``; exit status 1 with the reason when a build or verification fails."""
    if args.verify:
        return 1 if verify_repository(args.model_repository) else 0
    int8_only = ["--" + name.replace("_", "-") for name, default in INT8_DEFAULTS.items() if getattr(args, name) != default]
    if int8_only and not args.int8:
        LOG.error("fastpath build failed: %s applies to the INT8 version only; add --int8", ", ".join(int8_only))
        return 1
    if not args.model_repository.is_dir():  # a mistyped path: building there would leave models without config.pbtxt
        LOG.error("fastpath build failed: --model-repository %s is not a directory; build into an existing model "
                  "repository (a copy of %s holds every model's config.pbtxt)", args.model_repository, DEFAULT_REPOSITORY)
        return 1
    from fastpath.artifacts.detection import ensure_text_detection
    from fastpath.artifacts.staging import remove_abandoned

    for path in remove_abandoned(args.model_repository):  # left by a build killed with SIGKILL
        LOG.info("removed %s: the staging directory of a build that no longer runs", path)
    # SIGTERM (a `timeout`, an orchestrator, make's recipe stopped) unwinds like Ctrl-C: every staging directory
    # is removed on the way out, where the default action left a 69 MB one beside the versions for good
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        ensure_text_detection(args.model_repository, if_missing=args.if_missing)  # copied from the rapidocr wheel
        _build_text_embedding(args)
    except ArtifactError as exc:
        LOG.error("fastpath build failed: %s", exc)
        return 1
    return 0
