"""Fixtures shared by the build cores' tests."""

from __future__ import annotations

import os

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import wheelhouse


@pytest.fixture(scope="session")
def pip_args():
    """pip/uv arguments that install the build backend from the local wheelhouse (no index)."""
    house = wheelhouse()
    if house is None:
        # 26+ build tests need it: a skip would let the lane pass while proving nothing. Offline on purpose?
        # VLLM_OPS_OFFLINE=1 turns this into a skip, never in CI.
        reason = "could not download setuptools/setuptools-scm from PyPI into .cache/wheelhouse"
        if os.environ.get("VLLM_OPS_OFFLINE") == "1" and not os.environ.get("CI"):
            pytest.skip(reason)
        pytest.fail(reason + " (set VLLM_OPS_OFFLINE=1 to skip the build tests on a machine with no index)")
    return ["--no-index", "--find-links", str(house)]
