"""Texts, input arrays, model specs, statistics and the repository index, without a server."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fastpath_client import InvalidInputError, ServerError
from fastpath_client.tensors import (
    check_rows,
    chunks,
    model_spec,
    model_statistics,
    repository_versions,
    text_array,
    wire_array,
)

HTTP_CONFIG = {
    "name": "text_embedding", "max_batch_size": 64,
    "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1], "optional": False}],
    "output": [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [384]}],
}
GRPC_CONFIG = {"config": {
    "name": "text_embedding", "max_batch_size": 64,
    "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"]}],
    "output": [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": ["384"]}],
}}


def test_text_array_keeps_every_byte_in_an_object_array():
    """Trailing NULs, emoji, CJK and raw invalid UTF-8 bytes survive; numpy S would drop b"\\x00"."""
    texts = [" 😃 hello how are you", "的人有", "abc\x00", b"abc\x00", b"\xff\xfe\xfd", ""]
    array = text_array(texts)
    assert array.dtype == np.object_ and array.shape == (6, 1)
    assert array[:, 0].tolist() == [" 😃 hello how are you".encode(), "的人有".encode(), b"abc\x00", b"abc\x00",
                                    b"\xff\xfe\xfd", b""]
    assert np.array([b"abc\x00"], dtype=np.bytes_)[0] == b"abc"  # why object arrays: S drops the NUL


def test_text_array_refuses_a_bare_string_and_non_text():
    with pytest.raises(InvalidInputError, match=r"wrap it in a list"):
        text_array("hello")
    with pytest.raises(InvalidInputError, match=r"TEXT\[1\]: expected str or bytes, got int"):
        text_array(["ok", 3])


def test_text_array_refuses_a_lone_surrogate_naming_the_text_and_position():
    """A str Python holds but UTF-8 cannot encode (a lone surrogate) is the caller's bad input, named by
    index and position, not a raw UnicodeEncodeError."""
    with pytest.raises(InvalidInputError, match=r"TEXT\[1\]: character '\\ud800' at position 2 cannot be encoded as UTF-8"):
        text_array(["ok", "ab\ud800"])


@pytest.mark.parametrize("array", [np.array([[b"abc\x00"]]), np.array([["abc"]])])
def test_numpy_s_and_u_arrays_are_refused(array):
    with pytest.raises(InvalidInputError, match="drop trailing NUL"):
        wire_array("TEXT", array)
    with pytest.raises(InvalidInputError, match="TEXT: numpy .* arrays drop trailing NUL"):  # embed() as infer()
        text_array(array.ravel())


def test_wire_array_datatypes():
    assert wire_array("X", np.zeros((2, 3), np.float32))[1] == "FP32"
    assert wire_array("X", np.zeros((1, 4, 4, 3), np.uint8))[1] == "UINT8"
    assert wire_array("X", np.array([[b"a"]], dtype=object))[1] == "BYTES"
    assert wire_array("X", np.zeros((4, 4)).T)[0].flags.c_contiguous
    listed, datatype = wire_array("TEXT", [[b"abc\x00"], ["naïve"]])
    assert datatype == "BYTES" and listed.dtype == np.object_ and listed[0, 0] == b"abc\x00"


@pytest.mark.parametrize("config", [HTTP_CONFIG, GRPC_CONFIG])
def test_model_spec_from_http_and_grpc_configs(config):
    spec = model_spec(config)
    assert spec.max_batch_size == 64
    assert spec.input("TEXT").datatype == "BYTES" and spec.full_dims(spec.input("TEXT")) == (-1, 1)
    assert spec.outputs[0].dims == (384,)
    with pytest.raises(InvalidInputError, match=r"no input 'IMAGE'; inputs: \['TEXT'\]"):
        spec.input("IMAGE")


def test_chunks_cover_in_order():
    assert chunks(130, 64) == [slice(0, 64), slice(64, 128), slice(128, 130)]
    assert chunks(5, 0) == [slice(0, 5)] and chunks(0, 64) == []


def test_check_rows_names_both_shapes():
    with pytest.raises(ServerError, match=r"shape \[2, 384\] for 3 rows; expected \[3, 384\]"):
        check_rows("m", "EMBEDDING", np.zeros((2, 384)), 3, 384)


def test_statistics_from_grpc_json_with_string_ints():
    stats = {"model_stats": [{"name": "m", "version": "1", "inference_count": "12", "execution_count": "3",
                              "inference_stats": {"success": {"count": "4", "ns": "4000"}, "fail": {},
                                                  "queue": {"count": "4", "ns": "800"}}},
                             {"name": "other", "inference_stats": {"success": {"count": "9", "ns": "1"}}}]}
    totals = model_statistics(stats, "m")
    assert totals["success"] == (4, 4000) and totals["queue"] == (4, 800) and totals["fail"] == (0, 0)
    assert totals["inference_count"] == (12, 0) and totals["execution_count"] == (3, 0)


def test_repository_versions_http_list_and_grpc_dict():
    rows = [{"name": "m", "version": "10", "state": "READY"}, {"name": "m", "version": "2", "state": "UNAVAILABLE",
            "reason": "unloaded"}, {"name": "x", "version": "1", "state": "READY"}]
    expected = [{"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"},
                {"name": "m", "version": "10", "state": "READY", "reason": ""}]
    assert repository_versions(rows, "m") == expected
    assert repository_versions({"models": rows}, "m") == expected


def test_the_client_never_imports_the_server_package():
    code = ("import sys, fastpath_client, fastpath_client.loadgen, fastpath_client.report; "
            "bad = [m for m in sys.modules if m == 'fastpath' or m.startswith('fastpath.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_spec_reads_the_queue_bound_in_each_models_unit():
    """Invariant: max_queue_items is the model's FastPath queue bound, whatever its unit: text_embedding's
    max_queue_texts or text_detection's max_queue_images; None when the config sets neither."""
    def config(parameters):
        return {"name": "m", "parameters": {k: {"string_value": v} for k, v in parameters.items()}}

    assert model_spec(config({"max_queue_texts": "1024"})).max_queue_items == 1024
    assert model_spec(config({"max_queue_images": "64"})).max_queue_items == 64
    assert model_spec(config({})).max_queue_items is None
