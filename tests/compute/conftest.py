"""Fixtures for the compute tests: tiny random Llama models written once per test session."""

from __future__ import annotations

import pytest

from node.compute.model import make_tiny


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """A model cache dir shared by the session (holds tiny-0 and, on demand, other seeds)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_dir(tiny_cache):
    """Model dir of the tiny random Llama with seed 0 (6 blocks, hidden 64, vocab 320)."""
    return make_tiny(tiny_cache, seed=0)
