"""vllm_build as Ansible runs it: a subprocess reading its arguments from a JSON file."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_release_wheel
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import installed_version, make_tiny_repo

RETURNS = {"commit", "requested_ref", "release", "release_name", "built", "wheel", "wheel_sha256", "log_path"}
RETURNS |= {"duration", "inputs_hash", "changed", "precompiled", "precompiled_reason", "max_jobs", "stage_seconds"}
RETURNS |= {"status_path", "disk"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("module-repo") / "repo"
    return path, make_tiny_repo(path)


def run_module(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    result, proc = module_runner.run_module("vllm_build", tmp_path, args, check_mode=check_mode)
    return {**result, "_stdout": proc.stdout}


def make_wheel(directory: Path, version: str) -> Path:
    """A minimal valid pure-Python wheel of tinypkg (what a real build host would hand over)."""
    files = {
        "tinypkg/__init__.py": "STEP = 'from a wheel'\n",
        f"tinypkg-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n",
        f"tinypkg-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record_name = f"tinypkg-{version}.dist-info/RECORD"
    files[record_name] = "\n".join([*record, f"{record_name},,"]) + "\n"
    path = directory / f"tinypkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_check_mode_predicts_and_writes_nothing(tiny, tmp_path):
    repo, shas = tiny
    root = tmp_path / "root"
    result = run_module(tmp_path, check_mode=True, repo=str(repo), ref="v1.0.0", root=str(root), python=sys.executable)
    assert "failed" not in result, result
    assert set(result) >= RETURNS
    assert (result["changed"], result["built"], result["commit"]) == (True, False, shas["c1"])
    assert not root.exists()


@pytest.mark.slow
def test_installs_a_given_wheel_then_is_idempotent(tiny, tmp_path):
    repo, shas = tiny
    wheel = make_wheel(tmp_path, "9.9.9")
    args = {"repo": str(repo), "ref": "main", "root": str(tmp_path / "root"), "python": sys.executable}
    args.update(wheel=str(wheel), pip_args=["--no-index"], precompiled="never", run_id="r1")
    first = run_module(tmp_path, **args)
    assert "failed" not in first, first.get("msg")
    assert set(first) >= RETURNS
    assert (first["changed"], first["built"], first["commit"]) == (True, False, shas["c3"])
    assert first["release_name"] == f"{shas['c3'][:12]}-{first['inputs_hash'][:8]}"
    assert first["wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert installed_version(os.path.join(first["release"], "venv")) == "9.9.9"
    assert (first["precompiled"], first["precompiled_reason"]) == (False, "precompiled: never: full build")
    assert set(first["stage_seconds"]) == {"resolve", "install"}  # a wheel: nothing fetched, nothing built
    status = json.loads(Path(first["status_path"]).read_text())
    assert (status["run_id"], status["stage"], status["release_name"]) == ("r1", "done", first["release_name"])
    second = run_module(tmp_path, **dict(args, run_id="r2"))
    assert (second["changed"], second["release"], second["log_path"]) == (False, first["release"], first["log_path"])
    assert json.loads(Path(first["status_path"]).read_text())["run_id"] == "r2"


def test_failure_before_building_redacts_the_token(tiny, tmp_path):
    repo = "https://ci:hunter22secret@127.0.0.1:9/vllm.git"
    result = run_module(tmp_path, repo=repo, ref="main", root=str(tmp_path / "root"), python=sys.executable)
    assert result["failed"] is True
    assert "cannot reach repository https://127.0.0.1:9/vllm.git" in result["msg"]
    assert "hunter22secret" not in result["_stdout"]
    assert result["invocation"]["module_args"]["repo"] == "https://ci:********@127.0.0.1:9/vllm.git"
    assert os.listdir(tmp_path / "root") == ["build-status.json"]
    assert "hunter22secret" not in (tmp_path / "root" / "build-status.json").read_text()


def test_unknown_ref_fails_with_the_fix(tiny, tmp_path):
    repo = tiny[0]
    result = run_module(tmp_path, repo=str(repo), ref="nope", root=str(tmp_path / "root"), python=sys.executable)
    assert result["failed"] is True
    assert "ref 'nope' not found" in result["msg"] and "give an existing branch" in result["msg"]


@pytest.mark.slow
def test_secrets_in_pip_args_and_build_env_never_reach_the_output(tiny, tmp_path):
    """What -vvv shows (invocation) and every file the run writes hold no token."""
    repo = tiny[0]
    wheel = make_wheel(tmp_path, "9.9.9")
    token, hf = "idx-tok-4f2a9c", "hf_value_7d1e3b"
    args = {"repo": str(repo), "ref": "main", "root": str(tmp_path / "root"), "python": sys.executable}
    args.update(wheel=str(wheel), precompiled="never", build_env={"HF_TOKEN": hf, "DB_PASS": hf})
    args["pip_args"] = ["--no-index", "--extra-index-url", f"https://__token__:{token}@127.0.0.1:9/simple"]
    result = run_module(tmp_path, **args)
    assert "failed" not in result, result.get("msg")
    assert token not in result["_stdout"] and hf not in result["_stdout"]
    for path in Path(tmp_path / "root").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log"):
            text = path.read_text(errors="replace")
            assert token not in text and hf not in text, path


def test_check_mode_takes_a_version_alone_and_names_the_release(tmp_path):
    """As Ansible runs it, the fast half of the next test: the argument spec takes `version` without
    repo/ref, and check mode names the release and writes nothing (no venv, no pip)."""
    index = tmp_path / "index"
    make_release_wheel(index, "0.32.0", "g3cfc8f8b7")
    args = {"version": "0.32.0", "root": str(tmp_path / "root"), "python": sys.executable, "installer": "pip"}
    args["pip_args"] = ["--no-index", "--find-links", str(index)]
    result = run_module(tmp_path, check_mode=True, **args)
    assert "failed" not in result, result.get("msg")
    assert (result["changed"], result["source"], result["version"]) == (True, "release", "0.32.0")
    assert result["requested_ref"] is None and result["release_name"].startswith("vllm-0.32.0-")
    assert not (tmp_path / "root").exists()


@pytest.mark.slow_build  # two fresh venvs and pip installs: ~24 CPU-s, as the core's release tests
def test_a_release_needs_no_repo_or_ref_and_a_missing_version_names_the_index(tmp_path):
    """As Ansible runs it: `version` alone is valid input (repo/ref are not required), and a version the
    index lacks fails with the index and the fix in msg."""
    index = tmp_path / "index"
    make_release_wheel(index, "0.32.0", "g3cfc8f8b7")
    args = {"version": "0.32.0", "root": str(tmp_path / "root"), "python": sys.executable, "installer": "pip"}
    args["pip_args"] = ["--no-index", "--find-links", str(index)]
    first = run_module(tmp_path, **args)
    assert "failed" not in first, first.get("msg")
    assert (first["changed"], first["source"], first["version"], first["commit"]) == (
        True,
        "release",
        "0.32.0",
        "3cfc8f8b7",
    )
    assert first["requested_ref"] is None and first["release_name"].startswith("vllm-0.32.0-")
    missing = run_module(tmp_path, **{**args, "version": "0.33.0"})
    assert missing["failed"] and missing["version"] == "0.33.0"
    assert missing["msg"].startswith(f"vllm==0.33.0 is not on the index {index} (--no-index): pick a released")
    assert not (tmp_path / "root" / "current").exists()


def _serving_release(root: Path, mib: int) -> str:
    """A complete release of `mib` MiB that `current` names (what a build's need is estimated from)."""
    name = "0123456789ab-0badcafe"
    release = root / "releases" / name
    (release / "venv").mkdir(parents=True)
    (release / "venv" / "big.so").write_bytes(b"x" * mib * 1024**2)
    manifest = {"schema": 1, "name": name, "commit": "0123456789ab" * 3 + "0123", "built_at": "2026-11-01T00:00:00Z"}
    (release / "manifest.json").write_text(json.dumps(manifest))
    (root / "current").symlink_to(f"releases/{name}")
    return name


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_build_that_cannot_fit_its_disk_budget_fails_before_it_starts(tiny, tmp_path, check_mode):
    repo = tiny[0]
    root = tmp_path / "root"
    serving = _serving_release(root, 4)
    (root / "cache" / "uv").mkdir(parents=True)
    (root / "cache" / "uv" / "old.whl").write_bytes(b"y" * 1024**2)
    args = {"repo": str(repo), "ref": "main", "root": str(root), "python": sys.executable, "precompiled": "never"}
    result = run_module(tmp_path, check_mode=check_mode, disk_budget_gb=8 / 1024, **args)
    assert result["failed"] is True, result
    msg = result["msg"]
    # The serving release (4 MiB) + the estimate (4 MiB x 1.5) exceed 8 MiB whatever goes: named, with the fix.
    assert "does not fit disk_budget_gb=0.0078125" in msg and "raise disk_budget_gb" in msg, msg
    assert f"{root}/releases/{serving} (release, kept" in msg and "Nothing was changed" in msg
    assert sorted(os.listdir(root / "releases")) == [serving]  # no attempt was made
    assert (root / "cache" / "uv" / "old.whl").is_file()  # and nothing was freed
    assert not (root / "build").exists() or not os.listdir(root / "build")


def test_a_build_within_its_disk_budget_predicts_what_it_frees(tiny, tmp_path):
    repo = tiny[0]
    root = tmp_path / "root"
    _serving_release(root, 1)
    (root / "cache" / "uv").mkdir(parents=True)
    (root / "cache" / "uv" / "old.whl").write_bytes(b"y" * 3 * 1024**2)
    args = {"repo": str(repo), "ref": "main", "root": str(root), "python": sys.executable, "precompiled": "never"}
    result = run_module(tmp_path, check_mode=True, disk_budget_gb=4 / 1024, **args)
    assert "failed" not in result, result.get("msg")
    disk = result["disk"]
    assert disk["budget_bytes"] == 4 * 1024**2 and disk["need_bytes"] >= 1.5 * 1024**2
    assert [(item["path"], item["kind"]) for item in disk["freed"]] == [(str(root / "cache" / "uv"), "uv_cache")]
    assert disk["used_bytes_after"] + disk["need_bytes"] <= disk["budget_bytes"] < disk["used_bytes_before"]
    assert (root / "cache" / "uv" / "old.whl").is_file()  # check mode frees nothing
    unbounded = run_module(tmp_path, check_mode=True, **args)
    assert unbounded["disk"] is None
