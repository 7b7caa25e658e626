# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests of reading a drafter's config: where vLLM would load it from, and what the preflight gets from it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drafter import (
    PreflightError,
    load_drafter_config,
    locate_drafter_config,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._preflight import preflight
from ansible_collections.vllm_ops.dflash.tests.helpers.capabilities import captured

ROOT = Path(__file__).resolve().parents[4]
DRAFTERS = ROOT / "tests" / "unit" / "data" / "drafters"
TINY = json.loads((DRAFTERS / "tiny_dflash.json").read_text())
QWEN36 = json.loads((DRAFTERS / "qwen36_dflash.json").read_text())
DFLASH = {"method": "dflash", "model": "z-lab/Qwen3.6-27B-DFlash"}
FACTS = {
    "version": "0.26.0",
    "probes": {
        "dflash_aux_layer_offset": True,
        "dflash_aux_layer_offset_v2": True,
        "dflash_v2_runner": True,
        "dflash_sliding_window": True,
        "dflash_mixed_attention_v2": True,
        "dflash_mixed_attention_auto_v2": True,
    },
    "probe_errors": {},
}


def facts() -> Dict[str, Any]:
    """0.26.0's facts, with the capabilities its wheel answered."""
    return dict(FACTS, capabilities=captured("0.26.0"))


def write_config(directory: Path, config: Dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    return path


def hf_cache(root: Path, model_id: str, snapshots: Dict[str, Dict[str, Any]], main: Optional[str]) -> Path:
    repo = root / ("models--" + model_id.replace("/", "--"))
    for revision, config in snapshots.items():
        write_config(repo / "snapshots" / revision, config)
    if main:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(main + "\n")
    return repo


MODEL_ID = "z-lab/Qwen3.6-27B-DFlash"


def test_locate_a_config_file_and_a_model_dir(tmp_path: Path) -> None:
    path = write_config(tmp_path / "drafter", TINY)
    assert locate_drafter_config(str(path)) == str(path)
    assert locate_drafter_config(str(tmp_path / "drafter")) == str(path)


@pytest.mark.parametrize("under", ["", "hub"])
def test_locate_in_a_hugging_face_cache_root(tmp_path: Path, under: str) -> None:
    repo = hf_cache(tmp_path / under, MODEL_ID, {"aaa111": TINY, "bbb222": QWEN36}, main="bbb222")
    expected = str(repo / "snapshots" / "bbb222" / "config.json")
    assert locate_drafter_config(str(tmp_path), MODEL_ID) == expected
    assert locate_drafter_config(str(repo)) == expected
    assert locate_drafter_config(str(repo / "snapshots" / "aaa111")) == str(
        repo / "snapshots" / "aaa111" / "config.json"
    )


def test_cache_revision_by_ref_or_by_commit(tmp_path: Path) -> None:
    repo = hf_cache(tmp_path, MODEL_ID, {"aaa111": TINY, "bbb222": QWEN36}, main="bbb222")
    (repo / "refs" / "v1").write_text("aaa111")
    assert locate_drafter_config(str(tmp_path), MODEL_ID, "v1").endswith("aaa111/config.json")
    assert locate_drafter_config(str(tmp_path), MODEL_ID, "aaa111").endswith("aaa111/config.json")


def test_cache_with_one_snapshot_and_no_ref(tmp_path: Path) -> None:
    hf_cache(tmp_path, MODEL_ID, {"ccc333": QWEN36}, main=None)
    assert locate_drafter_config(str(tmp_path), MODEL_ID).endswith("ccc333/config.json")


def test_cache_with_several_snapshots_and_no_ref(tmp_path: Path) -> None:
    hf_cache(tmp_path, MODEL_ID, {"aaa111": TINY, "bbb222": QWEN36}, main=None)
    with pytest.raises(PreflightError, match=r"cannot tell which snapshot .* aaa111, bbb222\). Fix: set"):
        locate_drafter_config(str(tmp_path), MODEL_ID)


def test_cache_without_the_model(tmp_path: Path) -> None:
    hf_cache(tmp_path, "other/model", {"aaa111": TINY}, main="aaa111")
    with pytest.raises(PreflightError, match=f"no cached {MODEL_ID} under it"):
        locate_drafter_config(str(tmp_path), MODEL_ID)


def test_missing_path() -> None:
    with pytest.raises(PreflightError, match=r"^drafter_config: /nonexistent/x does not exist on this host\. Fix"):
        locate_drafter_config("/nonexistent/x")


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(PreflightError, match="holds a JSON list, not an object"):
        load_drafter_config(str(path))


def test_drafter_found_through_a_local_model_dir(tmp_path: Path) -> None:
    write_config(tmp_path / "Qwen3.6-27B-DFlash", QWEN36)
    result = preflight({"model": str(tmp_path / "Qwen3.6-27B-DFlash")}, vllm_facts=facts())
    assert result["findings"] == []
    assert result["drafter_config_path"] == str(tmp_path / "Qwen3.6-27B-DFlash" / "config.json")
    assert result["speculative_config"]["num_speculative_tokens"] == 15
    # what the verdict was given on, and none where no file was read
    config = tmp_path / "Qwen3.6-27B-DFlash" / "config.json"
    assert result["drafter_config_sha256"] == hashlib.sha256(config.read_bytes()).hexdigest()
    assert preflight({"method": "ngram"}, vllm_facts=facts())["drafter_config_sha256"] is None


def test_drafter_found_in_a_cache_with_the_spec_revision(tmp_path: Path) -> None:
    hf_cache(tmp_path, MODEL_ID, {"aaa111": TINY, "bbb222": QWEN36}, main="bbb222")
    result = preflight(dict(DFLASH, revision="aaa111"), drafter_config=str(tmp_path), vllm_facts=facts())
    assert result["drafter_config_path"].endswith("aaa111/config.json")
    assert result["speculative_config"]["num_speculative_tokens"] == 7


# ------------------------------------------------------------------------- issue 28: hostile drafter files


def test_a_deeply_nested_config_is_a_clear_finding_not_a_traceback(tmp_path: Path) -> None:
    # Case 14: json.load recursed into a RecursionError ("MODULE FAILURE", no message).
    config = tmp_path / "drafter" / "config.json"
    config.parent.mkdir()
    config.write_text('{"architectures": ' + "[" * 200_000 + "]" * 200_000 + "}")
    result = preflight(dict(DFLASH), drafter_config=str(config.parent), vllm_facts=facts())
    messages = [f["message"] for f in result["findings"] if f["level"] == "error"]
    assert any(f"{config} is nested deeper than 64 levels, which no drafter config.json is" in m for m in messages)


def test_a_huge_config_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    # "Also seen": a 1.2 GiB config.json took 1.2 GiB of RSS. A sparse file of 64 MiB stands for it here.
    config = tmp_path / "config.json"
    with open(config, "wb") as handle:
        handle.write(b'{"x": "')
        handle.truncate(64 * 1024 * 1024)
    with pytest.raises(PreflightError, match=r"config.json is larger than 4 MiB, which no drafter config.json is"):
        load_drafter_config(str(config))


SECRET = "root-only-secret-0123456789"


@pytest.mark.parametrize(
    "revision", ["../../../outside/secret", "/abs/secret", "main/../../../outside/secret", "a\nb", ".hidden"]
)
def test_a_crafted_revision_is_refused_and_never_reads_outside_the_cache(tmp_path: Path, revision: str) -> None:
    # Case 15: the revision became refs/<revision>, read and echoed in the error (a root-only file's content).
    repo = hf_cache(tmp_path / "hub", MODEL_ID, {"aaa111": TINY}, main="aaa111")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text(SECRET + "\n")
    result = preflight(dict(DFLASH, revision=revision), drafter_config=str(repo), vllm_facts=facts())
    errors = [f for f in result["findings"] if f["level"] == "error"]
    assert errors and all(SECRET not in f["message"] for f in result["findings"])
    assert any(f["field"] == "speculative_config.revision" and "is not a commit or a branch/tag name" in f["message"]
               for f in errors)  # fmt: skip


def test_a_ref_linked_out_of_the_cache_is_never_shown(tmp_path: Path) -> None:
    repo = hf_cache(tmp_path / "hub", MODEL_ID, {"aaa111": TINY}, main="aaa111")
    (tmp_path / "secret").write_text(SECRET + "\n")
    (repo / "refs" / "v2").symlink_to(tmp_path / "secret")
    (repo / "refs" / "v3").write_text(SECRET)  # inside refs/, but naming no snapshot
    for revision in ("v2", "v3"):
        with pytest.raises(PreflightError) as error:
            locate_drafter_config(str(tmp_path / "hub"), MODEL_ID, revision)
        assert SECRET not in str(error.value)
        assert f"refs/{revision} is not a Hugging Face cache ref naming one of its snapshots" in str(error.value)


def test_a_config_that_is_not_text_is_named_without_its_bytes(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(b'{"a": "\xff\xfe' + SECRET.encode() + b'"}')
    with pytest.raises(PreflightError) as error:
        load_drafter_config(str(config))
    assert f"{config} is not UTF-8 text" in str(error.value) and SECRET not in str(error.value)
