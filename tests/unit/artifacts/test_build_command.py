"""``fastpath build``: --verify, --if-missing on verified versions, failures exit 1 with the reason."""

import json
import logging
import os
import shutil

import pytest

from fastpath.cli.build import FP32_REQUIRED, _complete
from fastpath.cli.main import main
from tests.conftest import MODEL_REPOSITORY


def link_version(source, target):
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            try:
                os.link(path, target / path.name)  # hard links: no copy of 130 MB
            except OSError:  # another filesystem
                shutil.copyfile(path, target / path.name)


def test_verify_reports_each_version(tmp_path, caplog):
    link_version(MODEL_REPOSITORY / "text_embedding" / "1", tmp_path / "text_embedding" / "1")
    caplog.set_level(logging.INFO, logger="fastpath")
    assert main(["build", "--verify", "--model-repository", str(tmp_path)]) == 0
    files = len(json.loads((tmp_path / "text_embedding" / "1" / "manifest.json").read_text())["files"])
    assert f"text_embedding/1: ok (fp32, {files} files)" in caplog.text
    broken = tmp_path / "text_embedding" / "3"
    broken.mkdir()
    shutil.copyfile(MODEL_REPOSITORY / "text_embedding" / "1" / "manifest.json", broken / "manifest.json")
    shutil.copyfile(MODEL_REPOSITORY / "text_embedding" / "1" / "tokenizer.json", broken / "tokenizer.json")
    assert main(["build", "--verify", "--model-repository", str(tmp_path)]) == 1
    assert "text_embedding/3/golden.npz is listed in manifest.json but missing" in caplog.text


def test_verify_of_nothing_fails_naming_the_repository(tmp_path, caplog):
    """A mistyped --model-repository verified nothing and exited 0, which read as "all verified"."""
    caplog.set_level(logging.INFO, logger="fastpath")
    assert main(["build", "--verify", "--model-repository", str(tmp_path / "missing")]) == 1
    assert f"--model-repository {tmp_path / 'missing'}: is not a directory" in caplog.text
    assert main(["build", "--verify", "--model-repository", str(tmp_path)]) == 1
    assert "holds no version directory (<model>/<number>/): nothing to verify" in caplog.text


def test_if_missing_skips_a_verified_version(tmp_path, caplog):
    link_version(MODEL_REPOSITORY / "text_embedding" / "1", tmp_path / "text_embedding" / "1")
    link_version(MODEL_REPOSITORY / "text_detection" / "1", tmp_path / "text_detection" / "1")
    caplog.set_level(logging.INFO, logger="fastpath")
    assert main(["build", "--if-missing", "--model-repository", str(tmp_path)]) == 0
    assert "text_embedding version 1 (fp32) present and verified" in caplog.text


def test_an_incomplete_version_is_rebuilt_not_skipped(tmp_path, caplog):
    version = tmp_path / "1"
    link_version(MODEL_REPOSITORY / "text_embedding" / "1", version)
    assert _complete(version, FP32_REQUIRED)
    (version / "model.fp16.safetensors").unlink()
    assert not _complete(version, FP32_REQUIRED)
    assert "model.fp16.safetensors is listed in manifest.json but missing" in caplog.text


def test_int8_without_a_source_version_fails_with_the_reason(tmp_path, caplog):
    from fastpath.artifacts.int8 import build_int8_version
    from fastpath.errors import ArtifactError

    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        build_int8_version(tmp_path / "text_embedding")


def test_a_build_into_a_missing_repository_or_with_too_few_sentences_is_refused_before_anything_is_written(tmp_path, caplog, capsys):
    """A mistyped --model-repository made a half repository (versions without any config.pbtxt Triton could serve),
    and --calibration-texts -5 was taken: both are refused, nothing is created, and the message names the value."""
    caplog.set_level(logging.INFO, logger="fastpath")
    missing = tmp_path / "mistyped" / "repo"
    assert main(["build", "--model-repository", str(missing)]) == 1
    assert f"--model-repository {missing} is not a directory" in caplog.text and not (tmp_path / "mistyped").exists()
    for option in ("--calibration-texts", "--validation-texts", "--evaluation-texts"):
        with pytest.raises(SystemExit) as info:
            main(["build", "--int8", option, "-5", "--model-repository", str(tmp_path)])
        assert info.value.code == 2
        assert f"argument {option}: must be >= 1 (a number of sentences, 1 or more), got '-5'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_int8_options_without_int8_are_refused(tmp_path, caplog):
    """--calibration-texts 5 without --int8 re-exported version 1 and ignored the option: refused, naming it."""
    caplog.set_level(logging.INFO, logger="fastpath")
    assert main(["build", "--calibration-texts", "5", "--model-repository", str(tmp_path)]) == 1
    assert "--calibration-texts applies to the INT8 version only; add --int8" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_an_int8_build_removes_its_staging_directory(tmp_path):
    """Invariant: `fastpath build --int8` stopped by SIGTERM (what `timeout` or a stopped make recipe sends) exits
    143 and leaves no staging directory (the default action left 69 MB beside the versions for good)."""
    import signal
    import subprocess
    import sys
    import time

    link_version(MODEL_REPOSITORY / "text_embedding" / "1", tmp_path / "text_embedding" / "1")
    link_version(MODEL_REPOSITORY / "text_detection" / "1", tmp_path / "text_detection" / "1")
    build = subprocess.Popen([sys.executable, "-m", "fastpath", "build", "--if-missing", "--int8", "--model-repository",
                              str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "text_embedding").glob(".build-int8-*")) and time.monotonic() < deadline:
            assert build.poll() is None, "the build ended before it staged version 2"
            time.sleep(0.05)
        assert list((tmp_path / "text_embedding").glob(".build-int8-*")), "no staging directory within 120 s"
        build.send_signal(signal.SIGTERM)
        assert build.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        build.kill()
        build.wait()
    assert not list((tmp_path / "text_embedding").glob(".build-int8-*"))
    assert not (tmp_path / "text_embedding" / "2").exists()


def test_a_build_removes_the_staging_directories_of_builds_that_no_longer_run(tmp_path, caplog):
    """Invariant: `fastpath build` removes each .build-<step>-<pid>-* directory (in a model's or a version's directory)
    whose pid no longer runs, the leftovers of a build killed with SIGKILL, and keeps one whose builder runs."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    link_version(MODEL_REPOSITORY / "text_embedding" / "1", tmp_path / "text_embedding" / "1")
    link_version(MODEL_REPOSITORY / "text_detection" / "1", tmp_path / "text_detection" / "1")
    abandoned = [tmp_path / "text_embedding" / f".build-int8-2-{dead.pid}-ab12", tmp_path / "text_embedding" / "1" / f".build-external-{dead.pid}-cd34"]
    running = tmp_path / "text_embedding" / f".build-int8-2-{os.getpid()}-ef56"
    for path in (*abandoned, running):
        path.mkdir()
        (path / "model.onnx").write_bytes(b"partial")
    caplog.set_level(logging.INFO, logger="fastpath")
    assert main(["build", "--if-missing", "--model-repository", str(tmp_path)]) == 0
    assert not any(path.exists() for path in abandoned) and running.is_dir()
    assert all(f"removed {path}: the staging directory of a build that no longer runs" in caplog.text for path in abandoned)
