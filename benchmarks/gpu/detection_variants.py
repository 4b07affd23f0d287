"""The variants the served detection benchmark (served_detection_gpu.py) serves beside text_detection, and the model
repository it builds: each variant is the shipped configs/gpu.pbtxt with only the settings it names changed, so an
A/B between it and text_detection measures those settings alone (tests/unit/test_served_detection_variants.py).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from config_text import with_parameter  # benchmarks/config_text.py (the importer puts benchmarks/ on sys.path)
from detection_numerics import GPU_CONFIG, ROOT, VERSION_DIR

from fastpath.artifacts.detection_fp16 import CANDIDATE_GLOB, DEFAULT_CANDIDATES, candidate_path
from fastpath.manifest import MANIFEST_NAME, read_manifest, write_manifest

INSTANCE_COUNT = "instance_group.count"  # a variant key that sets the instance group's count, not a parameter
QUIET = {"opencv_threads": "1", "cuda_blocking_sync": "true"}  # no waiting thread spins (OpenCV's pool, CUDA's waits)
VARIANTS = {  # served beside text_detection when a cell names them: the shipped configs/gpu.pbtxt with these parameters changed
    "text_detection_tf32": {"cuda_tf32": "true"},
    "text_detection_nvjpeg": {"decode_device": "cuda"},
    # every shape on the graph-free session (as shipped before CUDA graphs with a session per shape)
    "text_detection_graph_free": {"max_cuda_graphs": "0", "cuda_graph_session_per_shape": "false"},
    # shapes without a graph on the one shared graph-free session, which rebuilds cuDNN plans at each change of
    # shape (as shipped before a graph-free session per shape)
    "text_detection_shared_eager": {"cuda_eager_session_per_shape": "false"},
    # the graph-free sessions per shape grow their CUDA arenas by what each allocation asks for, not in doubling chunks
    "text_detection_eager_exact_arena": {"cuda_eager_options": "arena_extend_strategy=kSameAsRequested"},
    # ONNX Runtime's default CPU pool for the CUDA EP sessions (one spinning worker per core), as shipped before one thread
    "text_detection_ort_pool": {"cuda_intra_op_threads": "0"},
    # two instances (stub processes) on the one GPU: decode, post-processing and the engine's Python split over two GILs
    "text_detection_x2": {INSTANCE_COUNT: "2"},
    # three or four instances, graphs for 736x1312 only (a 1280x720 photo under min/736): ~10 GiB of graph sessions each
    "text_detection_x3_one_shape": {INSTANCE_COUNT: "3", "capture_shapes_px": "736x1312"},
    "text_detection_x4_one_shape": {INSTANCE_COUNT: "4", "capture_shapes_px": "736x1312"},
    # no thread that waits spins (OpenCV calls on their calling thread, host threads sleep on the GPU), on the
    # configuration before three instances: one instance (or three), batches of up to 16 images
    **{name: {**QUIET, INSTANCE_COUNT: count, "capture_shapes_px": "736x1312", "batch_buckets": "1,2,4,8,16",
              "max_batch_images": "16"} for name, count in (("text_detection_quiet", "1"), ("text_detection_x3_quiet", "3"))},
    # configs/gpu.pbtxt before three instances and OpenCV on the calling thread: one instance, batches of up to 16
    "text_detection_one_instance": {INSTANCE_COUNT: "1", "opencv_threads": "0", "batch_buckets": "1,2,4,8,16",
                                    "max_batch_images": "16"},
    # c=1 beside the shipped config, one instance each: host threads sleep on the GPU or spin (CUDA's default wait),
    # or OpenCV's default pool
    "text_detection_blocking_sync": {INSTANCE_COUNT: "1", "cuda_blocking_sync": "true", "capture_shapes_px": "736x1312"},
    "text_detection_spin_wait_one": {INSTANCE_COUNT: "1", "cuda_blocking_sync": "false", "capture_shapes_px": "736x1312"},
    "text_detection_opencv_pool": {INSTANCE_COUNT: "1", "opencv_threads": "0", "capture_shapes_px": "736x1312"},
    # c=1 on one instance with one decode thread, against _blocking_sync (one instance, eight decode threads, as
    # shipped otherwise): at c=1 a thread pool's queue wakes a different one of the eight for each image, each idle
    # since its last one; one decoder is the same thread each time
    "text_detection_one_decoder_c1": {INSTANCE_COUNT: "1", "capture_shapes_px": "736x1312", "decode_threads": "1"},
    # the shipped three instances with decode and post threads taken longest-idle first (ThreadPoolExecutor), as
    # shipped before thread_pool_order lifo
    "text_detection_fifo": {"thread_pool_order": "fifo", "capture_shapes_px": "736x1312"},
    # the shipped three instances on OpenCV's pool (its workers sleep between calls: fastpath.models.text_detection)
    "text_detection_opencv_pool_x3": {"opencv_threads": "0", "capture_shapes_px": "736x1312"},
    # the shipped three instances with CUDA's default busy-wait (as shipped before cuda_blocking_sync true)
    "text_detection_spin_wait": {"cuda_blocking_sync": "false", "capture_shapes_px": "736x1312"},
    # the shipped three instances with batches of up to 16 images: graphs for 736x1312 only, ~9 GiB each
    "text_detection_x3_b16": {INSTANCE_COUNT: "3", "capture_shapes_px": "736x1312", "batch_buckets": "1,2,4,8,16",
                              "max_batch_images": "16"},
    # fp16 candidates of fastpath.artifacts.detection_fp16 (benchmarks/gpu/detection_precision.sh gates their boxes),
    # linked from --fp16-models into every version directory
    **{f"text_detection_fp16_{name}": {"gpu_artifact": candidate_path(Path(), name).name, "capture_shapes_px": "736x1312"}
       for name in DEFAULT_CANDIDATES},
    # more stub processes with batches of up to 8 images: ~6 GiB of graph sessions each
    **{f"text_detection_x{n}_quiet_b8": {**QUIET, INSTANCE_COUNT: str(n), "capture_shapes_px": "736x1312",
                                         "batch_buckets": "1,2,4,8", "max_batch_images": "8"} for n in (4, 5, 6)},
}


def build_repository(root: Path, variants: list[str], fp16_models: Path | None = None) -> Path:
    """text_detection (configs/gpu.pbtxt), the ``variants`` (of :data:`VARIANTS`) and naive_detection; the
    ``model.uint8.fp16.*.onnx`` files in ``fp16_models`` (when given) are linked into every version directory, and
    listed in its own manifest."""
    repository = root / "repo"
    for name, source in (("text_detection", ROOT / "model_repository" / "text_detection"),
                         ("naive_detection", ROOT / "benchmarks" / "models" / "naive_detection")):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").symlink_to(source / "1" / "model.py")  # linked: it imports beside itself
        for artifact in ("model.onnx", "model.uint8.onnx", "manifest.json"):
            (repository / name / "1" / artifact).symlink_to((VERSION_DIR / artifact).resolve())
        candidates = sorted(fp16_models.glob(CANDIDATE_GLOB)) if fp16_models else []
        for candidate in candidates:
            (repository / name / "1" / candidate.name).symlink_to(candidate.resolve())
        if candidates:  # a model loads only a file its version's manifest lists: list the candidates beside the shipped files
            shipped = read_manifest(VERSION_DIR)
            (repository / name / "1" / MANIFEST_NAME).unlink()
            write_manifest(repository / name / "1", [*shipped["files"], *(c.name for c in candidates)],
                           {key: value for key, value in shipped.items() if key not in ("files", "sizes")})
    shutil.copy(GPU_CONFIG, repository / "text_detection" / "config.pbtxt")
    shutil.copy(ROOT / "benchmarks" / "models" / "naive_detection" / "config.pbtxt", repository / "naive_detection" / "config.pbtxt")
    for variant in variants:
        shutil.copytree(repository / "text_detection", repository / variant, symlinks=True)
        config = GPU_CONFIG.read_text()
        for key, value in VARIANTS[variant].items():
            if key == INSTANCE_COUNT:
                config, found = re.subn(r"(kind: KIND_GPU\s+count: )\d+", rf"\g<1>{value}", config)
                assert found == 1, "configs/gpu.pbtxt: no KIND_GPU instance group with a count"
                continue
            config = with_parameter(config, key, value)
        (repository / variant / "config.pbtxt").write_text(config.replace('name: "text_detection"', f'name: "{variant}"'))
    return repository


def named_models(*specs: str) -> set[str]:
    """The models that ``MODEL:...`` cell specs (``;``-separated) name."""
    return {cell.split(":")[0] for spec in specs for cell in spec.split(";") if cell}


def named_variants(*specs: str) -> list[str]:
    """The :data:`VARIANTS` that ``MODEL:...`` cell specs (``;``-separated) name, in :data:`VARIANTS` order.

    Raises:
        SystemExit: a cell names a model that is neither text_detection, naive_detection nor a variant.
    """
    named = named_models(*specs)
    unknown = named - {"text_detection", "naive_detection", *VARIANTS}
    if unknown:
        raise SystemExit(f"cells name unknown models {sorted(unknown)}; variants: {sorted(VARIANTS)}")
    return [variant for variant in VARIANTS if variant in named]
