"""Shared fixtures: deterministic seeds and one torch thread (tests run beside each other)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
