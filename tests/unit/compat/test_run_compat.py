"""The matrix of `make compat` (tests/compat/run_compat.py), from captured capabilities and a source tree:
probes judged the way vllm_facts judges them, one column per release, one row per probe and capability."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any, Dict

import pytest

CHECKOUT = Path(__file__).resolve().parents[3]
CAPTURES = CHECKOUT / "tests" / "unit" / "data" / "capabilities"


@pytest.fixture(scope="module")
def compat() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_compat", CHECKOUT / "tests" / "compat" / "run_compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def captured(version: str) -> Dict[str, Any]:
    return json.loads((CAPTURES / f"{version}.json").read_text())


def test_probes_are_judged_like_vllm_facts(compat: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "vllm.py").write_text("if self._dflash_needs_multi_kv_group():\n    return True\n")
    probes = [
        {"name": "found", "path": "config/vllm.py", "pattern": r"_dflash_needs_multi_kv_group\(\)"},
        {"name": "absent", "path": "config/vllm.py", "pattern": "use_v3"},
        {"name": "moved", "path": "config/gone.py", "pattern": "x"},
    ]
    assert compat.evaluate_probes(tmp_path, probes) == {"found": "yes", "absent": "no", "moved": "no file"}


def test_summary_of_the_newest_and_an_old_release(compat: ModuleType) -> None:
    newest = compat.summary(captured("0.33.0"), 61.24)
    assert newest["rejection `fly`"] == "yes"
    assert newest["methods `medusa`, `mlp_speculator`"] == "no"
    assert newest["method `dspark`"] == "yes"
    assert "DFlash2DraftModel" in newest["DFlash architectures registered"].split("<br>")
    assert "LiLiCorrDraftModel" in newest["DFlash architectures registered"].split("<br>")
    assert newest["default model runner"] == "v2"
    assert newest["capability script seconds"] == "61.2"
    assert newest["keys not read (errors)"] == "none"
    old = compat.summary(captured("0.20.1"), None)
    assert old["draft_sample_method values"] == "(no field)"
    assert old["capability script seconds"] == "n/a"
    assert old["methods `medusa`, `mlp_speculator`"] == "yes"


def test_render_has_a_column_per_release_and_a_row_per_probe_and_capability(compat: ModuleType) -> None:
    results = {
        version: {
            "probes": {"p1": "yes", "p2": "no file"},
            "summary": compat.summary(captured(version), 1.0),
            "capabilities": captured(version),
        }
        for version in ("0.26.0", "0.33.0")
    }
    meta = {"date": "2026-12-01", "python": "3.11.2", "host": "x86_64, 2 CPUs", "load": "3.0, 2 CPUs"}
    text = compat.render(results, ["p1", "p2"], meta)
    assert "Produced on 2026-12-01 by `make compat`" in text
    assert text.count("| | 0.26.0 | 0.33.0 |") == 2  # the probe table and the capability table
    assert "| `p2` | no file | no file |" in text
    assert "| default model runner | v1 | v2 |" in text
    assert "| rejection `fly` | no | yes |" in text
    assert "### 0.26.0 -> 0.33.0" in text


def test_changes_name_what_was_added_and_removed(compat: ModuleType) -> None:
    lines = compat.changes(captured("0.30.0"), captured("0.33.0"))
    methods = next(line for line in lines if line.startswith("- speculative methods:"))
    assert "removed `medusa`, `mlp_speculator`" in methods
    rejection = next(line for line in lines if line.startswith("- rejection_sample_method values:"))
    assert rejection == "- rejection_sample_method values: added `fly`"
    assert any(line.startswith("- DFlash architectures: added ") and "`LiLiCorrDraftModel`" in line for line in lines)
    assert not any(line.startswith("- default model runner") for line in lines)
    runner = compat.changes(captured("0.28.0"), captured("0.30.0"))
    assert "- default model runner: v1 -> v2" in runner
    assert compat.changes(captured("0.26.0"), captured("0.26.0")) == []
