"""Fixtures for the inference tests: the tiny random Llama (6 blocks, hidden 64) written once per session."""

from __future__ import annotations

import pytest

from node.compute.model import make_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)
