"""Edits of config.pbtxt text for the benchmarks' model repositories (and the tests' variant repositories)."""

from __future__ import annotations

import re


def with_parameter(config: str, key: str, value: str) -> str:
    """``config`` (config.pbtxt text) with the FastPath parameter ``key`` set to ``value``: its
    ``parameters { key: ... }`` line replaced, or appended when the config has none."""
    line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
    config, found = re.subn(rf'^parameters \{{ key: "{key}" value: \{{ string_value: "[^"]*" \}} \}}$', line, config, flags=re.M)
    if found:
        return config
    return config + ("" if config.endswith("\n") else "\n") + line + "\n"
