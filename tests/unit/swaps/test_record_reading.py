"""Reading a serving-version record whatever the file holds: a valid record, or 'record unreadable: ...'.

The server reads the record when a text_embedding instance loads and on every ``status`` and ``rollback``;
these tests feed the reader arbitrary bytes and arbitrary JSON and check it never raises anything else,
and that whatever it accepts is a record the server can use (formatted in the load's log line, sent in
``status``, written back unchanged).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fastpath.errors import VersionRecordError
from fastpath.swaps.record import MAX_RECORD_BYTES, MAX_SINCE_S, VersionRecord, read_record, write_record

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=10), children, max_size=4), max_leaves=20)
# record-shaped documents: the real keys, each holding a right or a wrong value
record_like = st.fixed_dictionaries({}, optional={
    "version": st.integers(-2, 5) | json_values,
    "previous_version": st.none() | st.integers(-2, 5) | json_values,
    "since": st.floats(-10.0, 2 * MAX_SINCE_S) | st.integers(-10, 10**20) | json_values,
    "reason": st.sampled_from(["swap", "rollback", "loaded", "swap \u00e9", ""]) | json_values,
    "command": st.none() | json_values | st.fixed_dictionaries({}, optional={
        "state_dir": st.text(max_size=20) | json_values, "generation": st.integers(-2, 10**6) | json_values,
        "ok": st.booleans() | json_values}),
    "extra": json_values,
})


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "serving_version.json"


def read_as_the_server_does(path: Path) -> VersionRecord | None:
    """read_record, checked against the only two outcomes allowed.

    Invariant: either a VersionRecord that the server can use (its load log line formats ``since``,
    ``status`` sends ``as_dict()`` as JSON, and writing it back reads back equal), or a
    VersionRecordError whose message starts 'record unreadable: <path>: ' and stays under 2000 characters.
    Returns the record, or None when the file was refused.
    """
    try:
        record = read_record(path)
    except VersionRecordError as exc:
        assert str(exc).startswith(f"record unreadable: {path}: "), str(exc)
        assert len(str(exc)) < 2000, str(exc)  # bounded, however large the values in the file
        return None
    assert isinstance(record, VersionRecord)
    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.since))
    json.dumps(record.as_dict(), allow_nan=False)
    copy = path.with_name("copy.json")
    write_record(copy, record)
    assert read_record(copy) == record
    return record


@FUZZ
@given(data=st.binary(max_size=400))
@example(data=b"[" * 200_000 + b"]" * 200_000)
@example(data=b"[" * 30_000 + b"]" * 30_000)  # under the size limit: deeper than the JSON parser recurses
@example(data=b"\xff\xfe{}")
@example(data=b"\x00" * 64)
@example(data=b"")
def test_any_bytes_read_as_a_record_or_as_unreadable(path, data):
    path.write_bytes(data)
    read_as_the_server_does(path)


@FUZZ
@given(document=json_values)
def test_any_json_value_reads_as_a_record_or_as_unreadable(path, document):
    path.write_text(json.dumps(document))
    assert read_as_the_server_does(path) is None or isinstance(document, dict)


@FUZZ
@given(document=record_like)
def test_a_record_shaped_document_is_accepted_exactly_when_every_field_is_valid(path, document):
    """Invariant: accepted <=> every field present has the documented type and range; an accepted
    record holds the document's values (defaults for absent ones)."""
    path.write_text(json.dumps(document), encoding="utf-8")
    record = read_as_the_server_does(path)
    command = {} if document.get("command") is None else document["command"]  # null or absent: no command
    since = document.get("since", 0.0)
    valid = ("version" in document and _int_at_least(document["version"], 1)
             and (document.get("previous_version") is None or _int_at_least(document["previous_version"], 1))
             and isinstance(since, (int, float)) and not isinstance(since, bool) and 0 <= since <= MAX_SINCE_S
             and isinstance(document.get("reason", "swap"), str)
             and isinstance(command, dict) and isinstance(command.get("state_dir", ""), str)
             and _int_at_least(command.get("generation", 0), 0) and isinstance(command.get("ok", True), bool))
    assert (record is not None) == valid, (document, record)
    if record is not None:
        assert (record.version, record.previous_version, record.since, record.reason) == (
            document["version"], document.get("previous_version"), since, document.get("reason", "swap"))
        assert (record.state_dir, record.generation, record.ok) == (
            command.get("state_dir", ""), command.get("generation", 0), command.get("ok", True))


def _int_at_least(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def test_a_utf8_reason_reads_as_a_valid_record(path):
    """A record holding non-ASCII UTF-8 text is valid: read as UTF-8 whatever the process's locale."""
    path.write_bytes(b'{"version": 2, "previous_version": 1, "reason": "swap \xc3\xa9"}')
    assert read_as_the_server_does(path) == VersionRecord(version=2, previous_version=1, reason="swap \u00e9")


@pytest.mark.parametrize(("data", "problem"), [
    (b"[" * 200_000 + b"]" * 200_000, f"is larger than {MAX_RECORD_BYTES} bytes"),
    (b"[" * 30_000 + b"]" * 30_000, "nested too deeply to parse"),
    (b'{"version": 2, "reason": "\xff"}', "is not UTF-8 text (byte 26: invalid start byte)"),
])
def test_what_the_json_parser_cannot_take_is_refused_with_its_reason(path, data, problem):
    path.write_bytes(data)
    with pytest.raises(VersionRecordError, match="record unreadable") as info:
        read_record(path)
    assert problem in str(info.value)


def test_the_size_limit_is_exact(path):
    """Invariant: a valid record of MAX_RECORD_BYTES bytes is read; one byte more is refused unread."""
    text = json.dumps({"version": 2})
    path.write_text(text + " " * (MAX_RECORD_BYTES - len(text)))
    assert read_record(path) == VersionRecord(version=2)
    path.write_text(text + " " * (MAX_RECORD_BYTES + 1 - len(text)))
    with pytest.raises(VersionRecordError, match=f"larger than {MAX_RECORD_BYTES} bytes"):
        read_record(path)


def test_a_fifo_or_a_directory_in_its_place_is_refused_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.json")  # no writer: a blocking open would never return
    with pytest.raises(VersionRecordError, match="is not a regular file"):
        read_record(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(VersionRecordError, match="is not a regular file"):
        read_record(tmp_path / "dir.json")
