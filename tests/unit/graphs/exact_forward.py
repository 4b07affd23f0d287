"""A tiny exact forward for testing the graph mechanism: per row, the masked sum of ids and the token count.

Every output value is an exact integer that numpy reproduces, so a stale, shifted or filler row
shows up as a wrong number. Used by tests/unit/graphs (CPU) and tests/gpu/test_graphs.py (CUDA).
"""

import numpy as np


def masked_sum(ids, mask, types):
    """float [B, 2]: (sum of ids where mask, tokens + sum of types)."""
    import torch

    mask = mask.to(ids.dtype)
    return torch.stack([(ids * mask).sum(1), mask.sum(1) + types.sum(1)], dim=1).float()


def expected(batch: dict[str, np.ndarray]) -> np.ndarray:
    """What :func:`masked_sum` must return for ``batch``."""
    return np.stack([(batch["input_ids"] * batch["attention_mask"]).sum(1), batch["attention_mask"].sum(1)], axis=1).astype(np.float32)


def make_batch(rng: np.random.Generator, rows: int, length: int) -> dict[str, np.ndarray]:
    """``rows`` right-padded sequences of 1..``length`` random ids in [1000, 2000)."""
    lengths = rng.integers(1, length + 1, size=rows)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(1000, 2000, size=(rows, length), dtype=np.int64) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
