"""The TensorRT runtime without TensorRT: imports cleanly, says what is missing, plans and cache keys.

The tests that need TensorRT skip, naming the package, where it is not installed.
"""

import importlib.util

import pytest

from fastpath.engines import load_engine
from fastpath.engines.tensorrt import EngineCache, PlanKey, bucket_profiles, builder_flags, plan_key, require_tensorrt
from fastpath.errors import ConfigError, EngineError
from fastpath.graphs import Bucket, BucketGrid

HAVE_TENSORRT = importlib.util.find_spec("tensorrt") is not None
needs_tensorrt = pytest.mark.skipif(not HAVE_TENSORRT, reason="the 'tensorrt' package (TensorRT 10) is not installed here")
without_tensorrt = pytest.mark.skipif(HAVE_TENSORRT, reason="TensorRT is installed: the missing-package message cannot be checked")

GRID = BucketGrid((1, 4), (16, 64))


def key(**changes):
    fields = dict(onnx_sha256="ab" * 32, gpu_name="NVIDIA H200", compute_capability=(9, 0), tensorrt_version="10.8.0",
                  precision="int8", grid=GRID)
    fields.update(changes)
    return plan_key(**fields)


@without_tensorrt
def test_using_it_without_tensorrt_names_the_package():
    with pytest.raises(EngineError, match="needs the 'tensorrt' Python package .*TensorRT 10.*not installed here"):
        require_tensorrt()
    with pytest.raises(EngineError, match="'tensorrt' Python package"):
        load_engine("tensorrt", "model.onnx", precision="int8")


def test_one_exact_profile_per_bucket_largest_first():
    profiles = bucket_profiles(GRID)
    assert [p.bucket for p in profiles] == [Bucket(4, 64), Bucket(4, 16), Bucket(1, 64), Bucket(1, 16)]
    assert all(p.min_shape == p.opt_shape == p.max_shape == (p.bucket.batch, p.bucket.length) for p in profiles)


@pytest.mark.parametrize(("precision", "flags"), [("fp32", ()), ("fp16", ("FP16",)), ("int8", ("INT8", "FP16")), ("fp8", ("FP8", "FP16"))])
def test_builder_flags(precision, flags):
    assert builder_flags(precision) == flags


def test_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match="TensorRT precision 'int4'"):
        key(precision="int4")


def test_cache_key_changes_with_everything_a_plan_depends_on():
    base = key()
    assert base.digest() == key().digest() and len(base.digest()) == 64
    variants = [key(onnx_sha256="cd" * 32), key(gpu_name="NVIDIA H100"), key(compute_capability=(8, 9)),
                key(tensorrt_version="10.9.0"), key(precision="fp16"), key(grid=BucketGrid((1, 8), (16, 64)))]
    assert len({v.digest() for v in variants} | {base.digest()}) == len(variants) + 1
    assert base.file_name().startswith("int8-") and base.file_name().endswith(".plan")
    assert isinstance(base, PlanKey)


def test_engine_cache_builds_once_and_stores_the_key(tmp_path):
    cache = EngineCache(tmp_path / "plans")
    calls = []

    def build():
        calls.append(1)
        return b"serialized plan bytes"

    assert cache.get_or_build(key(), build) == b"serialized plan bytes"
    assert cache.get_or_build(key(), build) == b"serialized plan bytes"
    assert len(calls) == 1
    assert cache.path(key()).with_suffix(".json").read_text().count("NVIDIA H200") == 1
    assert cache.get_or_build(key(precision="fp16"), lambda: b"other") == b"other"  # another key, another plan


@needs_tensorrt
def test_build_and_run_with_tensorrt(tmp_path):
    from tests.conftest import MODEL_REPOSITORY

    engine = load_engine("tensorrt", str(MODEL_REPOSITORY / "text_embedding" / "2" / "model.onnx"), precision="int8",
                         batch_sizes=(1, 4), lengths=(16,), cache_dir=str(tmp_path))
    try:
        assert len(engine.buckets) == 2
    finally:
        engine.close()
