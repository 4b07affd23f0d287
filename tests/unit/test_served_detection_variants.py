"""The served detection benchmark's variants (benchmarks/gpu/served_detection_gpu.py): each is the shipped
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

from served_detection_gpu import INSTANCE_COUNT, VARIANTS, build_repository  # noqa: E402

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
