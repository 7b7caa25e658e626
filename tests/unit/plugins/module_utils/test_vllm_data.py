# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fallback tables are what each release's vLLM answered (its captured capabilities), nothing else."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _vllm_data
from ansible_collections.vllm_ops.dflash.plugins.module_utils._vllm_data import (
    JUDGED_KEYS,
    RELEASES,
    draft_architectures,
    fallback_release,
    release_tuple,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.capabilities import CAPABILITIES, captured


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_each_table_is_its_release_captured(release: str) -> None:
    capabilities = captured(release)
    for key in JUDGED_KEYS:
        expected = capabilities[key]
        if key == "registered_architectures":
            expected = draft_architectures(expected)
        table = RELEASES[release][key]
        assert (list(table) if isinstance(table, tuple) else table) == (
            list(expected) if isinstance(expected, (list, tuple)) else expected
        ), key


def test_tables_cover_0_26_and_the_newer_captured_releases() -> None:
    newer = sorted(p.stem for p in CAPABILITIES.glob("*.json") if release_tuple(p.stem) >= (0, 26, 0))
    assert sorted(RELEASES) == newer


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.33.0", "0.33.0"),
        ("0.34.0.dev12+gabc", "0.33.0"),
        ("0.31.2", "0.30.0"),
        ("0.29.1rc1.dev263+gb0b2f27da.d20260917", "0.28.0"),
        ("0.26.0", "0.26.0"),
        ("0.20.1", "0.26.0"),  # older than every table: the one the rules were first written against
        ("0.1.dev16016+g3cfc8f8b7", "0.26.0"),  # a fork's version says nothing
        (None, "0.26.0"),
    ],
)
def test_fallback_release(version: Optional[str], expected: str) -> None:
    assert fallback_release(version) == expected


def test_core_is_python38_syntax() -> None:
    ast.parse(Path(_vllm_data.__file__).read_text(), feature_version=(3, 8))
