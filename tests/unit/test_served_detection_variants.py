"""The served detection benchmark's variants (benchmarks/gpu/detection_variants.py): each is the shipped
configs/gpu.pbtxt with only the parameters it names changed, so an A/B between it and text_detection measures
those parameters alone."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from detection_variants import INSTANCE_COUNT, VARIANTS, build_repository  # noqa: E402

PARAMETER = re.compile(r'parameters \{ key: "([^"]+)" value: \{ string_value: "([^"]*)" \} \}')


def settings(config: str) -> dict[str, str]:
    """Every parameter of a config.pbtxt, and its instance group's count under INSTANCE_COUNT."""
    found = dict(PARAMETER.findall(config))
    found[INSTANCE_COUNT] = re.search(r"kind: KIND_GPU\s+count: (\d+)", config).group(1)
    return found


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_variant_changes_exactly_the_settings_it_names(tmp_path, variant):
    """Invariant: the variant's config.pbtxt equals the shipped text_detection config in every parameter and in
    its instance count, except the settings the variant names, which carry its values; its name is its own."""
    repository = build_repository(tmp_path, [variant])
    shipped = settings((repository / "text_detection" / "config.pbtxt").read_text())
    config = (repository / variant / "config.pbtxt").read_text()
    served = settings(config)
    assert f'name: "{variant}"' in config
    assert {key: served[key] for key in VARIANTS[variant]} == VARIANTS[variant]
    changed = {key for key in served.keys() | shipped.keys() if served.get(key) != shipped.get(key)}
    assert changed <= set(VARIANTS[variant]) and changed, f"{variant} changes nothing the shipped config does not set"


def test_fp16_candidates_are_linked_into_every_version_directory_and_their_variants_name_them(tmp_path):
    """Invariant: with a folder of model.uint8.fp16.*.onnx, every served model's version directory holds a link to
    each candidate (so a text_detection_fp16_* variant's gpu_artifact exists beside model.uint8.onnx); other files of
    the folder are not linked."""
    folder = tmp_path / "fp16"
    folder.mkdir()
    (folder / "model.uint8.fp16.range_backbone.onnx").write_bytes(b"candidate")
    (folder / "fp16_candidates.json").write_text("{}")
    variant = "text_detection_fp16_range_backbone"
    repository = build_repository(tmp_path / "root", [variant], folder)
    for model in ("text_detection", variant, "naive_detection"):
        version = repository / model / "1"
        assert (version / "model.uint8.fp16.range_backbone.onnx").read_bytes() == b"candidate"
        assert not (version / "fp16_candidates.json").exists()
    assert VARIANTS[variant]["gpu_artifact"] == "model.uint8.fp16.range_backbone.onnx"
