"""Fixtures shared by the build cores' tests."""

from __future__ import annotations

import os

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import uv_bin_dir, wheelhouse


@pytest.fixture(scope="session")
def pip_args():
    """pip/uv arguments that install the build backend from the local wheelhouse (no index)."""
    house = wheelhouse()
    if house is None:
        _missing("could not download setuptools/setuptools-scm from PyPI into .cache/wheelhouse")
    return ["--no-index", "--find-links", str(house)]


@pytest.fixture()
def uv_on_path(monkeypatch):
    """`uv` (pip-installed once into .cache/uv) first on PATH, for the tests of the uv installer."""
    found = uv_bin_dir()
    if found is None:
        _missing("could not pip-install uv from PyPI into .cache/uv")
    monkeypatch.setenv("PATH", f"{found}{os.pathsep}{os.environ['PATH']}")
    return found


def _missing(reason):
    # The build tests need it: a skip would let the lane pass while proving nothing. Offline on purpose?
    # VLLM_OPS_OFFLINE=1 turns this into a skip, never in CI.
    if os.environ.get("VLLM_OPS_OFFLINE") == "1" and not os.environ.get("CI"):
        pytest.skip(reason)
    pytest.fail(reason + " (set VLLM_OPS_OFFLINE=1 to skip the build tests on a machine with no index)")
