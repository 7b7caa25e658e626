"""Fixtures shared by the build cores' tests."""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import wheelhouse


@pytest.fixture(scope="session")
def pip_args():
    """pip/uv arguments that install the build backend from the local wheelhouse (no index)."""
    house = wheelhouse()
    if house is None:
        pytest.skip("could not download setuptools/setuptools-scm from PyPI into .cache/wheelhouse")
    return ["--no-index", "--find-links", str(house)]
