# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU rehearsal of the proof on real hardware: run_proof.sh and proof.yml, unchanged, against the fixture
engine (TEST EQUIPMENT standing in for vLLM) installed the way the H200 run installs vLLM: a wheel put in
a tree with `pip install --target`, made into a release by make_release.py. About a minute."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ENGINE = REPO / "tests" / "fixtures" / "engine"
DRAFTER = REPO / "tests" / "unit" / "data" / "drafters" / "tiny_dflash.json"  # the H200 run's drafter

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow_build,  # pip builds the engine, then ansible-playbook runs the proof
    pytest.mark.skipif(not (ENGINE / "pyproject.toml").is_file(), reason="the fixture engine is not in this tree"),
    pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("git") is None, reason="needs git and gcc"),
]


def run(*args: str, **kwargs) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]} {result.stderr[-2000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def engine_site(tmp_path_factory) -> tuple:
    """(site dir holding the engine's wheel install, its version)."""
    tmp = tmp_path_factory.mktemp("engine")
    run(sys.executable, str(REPO / "tests" / "helpers" / "engine_repo.py"), str(tmp / "repo"))
    run("git", "clone", "-q", str(tmp / "repo"), str(tmp / "checkout"))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(tmp / "wheels"),
        str(tmp / "checkout"))  # fmt: skip
    wheel = next((tmp / "wheels").glob("vllm-*.whl"))
    run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(tmp / "site"),
        str(wheel))  # fmt: skip
    version = wheel.name.split("-")[1].replace("%2B", "+")
    return tmp / "site", version


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_proof(tmp_path: Path, engine_site: tuple, **extra: str) -> tuple:
    """run_proof.sh against the fixture engine, which must pass: (summary.json, the results folder)."""
    site, version = engine_site
    models = tmp_path / "models"
    (models / "tiny-qwen3-dflash").mkdir(parents=True)
    (models / "tiny-qwen3").mkdir()
    shutil.copy(DRAFTER, models / "tiny-qwen3-dflash" / "config.json")
    (models / "tiny-qwen3" / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (models / "model_info.json").write_text("{}")  # present: run_proof.sh does not build models (no torch here)
    results = tmp_path / "results"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PROOF_", "ANSIBLE_")) and key not in ("OUT", "PYTHONPATH")
    }
    env.update(
        OUT=str(results),
        PROOF_BASE=str(tmp_path / "base"),
        PROOF_BUDGET="300",
        PROOF_SITE=str(site),
        PROOF_MODELS=str(models),
        PROOF_PYTHON=sys.executable,  # imports ansible: no install from .whl
        PROOF_BASE_PYTHON=sys.executable,
        # the engine needs PyYAML at runtime: this interpreter's site-packages, as the H200 run adds torch's
        PROOF_SITE_DIRS=f"{site}:{sysconfig.get_paths()['purelib']}",
        PROOF_ROOT=str(tmp_path / "opt" / "vllm"),
        PROOF_CONFIG_DIR=str(tmp_path / "etc" / "vllm"),
        PROOF_STATE_ROOT=str(tmp_path / "state"),
        PROOF_PORT=str(free_port()),
        PROOF_EXPECT_VERSION=version,
        PROOF_VARS=str(HERE / "engine.yml"),
        **extra,
    )
    proc = subprocess.run(
        ["bash", str(HERE / "run_proof.sh")], env=env, capture_output=True, text=True, timeout=400, check=False
    )
    summary = json.loads((results / "summary.json").read_text())
    failures = {name: case["error"] for name, case in summary["cases"].items() if not case["ok"]}
    assert proc.returncode == 0, f"{failures or summary['run']}\n{proc.stdout[-3000:]}"
    return summary, results


def test_the_proof_passes_against_the_fixture_engine(tmp_path, engine_site):
    version = engine_site[1]
    summary, results = run_proof(tmp_path, engine_site)
    assert summary["passed"] is True
    assert sorted(summary["cases"]) == ["engine_death", "facts", "preflight", "random", "release", "synthetic"]
    assert sorted(p.name for p in results.iterdir()) == ["ansible.log", "facts-vllm.json", "proof.tgz", "summary.json"]

    facts = summary["cases"]["facts"]["data"]
    assert facts["version"] == summary["vllm_version"] == version
    assert facts["missing_extensions"] == ["vllm.vllm_flash_attn._vllm_fa2_C"]
    assert facts["broken_extensions"] == []
    assert sorted(facts["extensions_ok"]) == ["vllm._C", "vllm._moe_C", "vllm.cumem_allocator"]

    release = summary["cases"]["release"]["data"]
    digest = release["manifest"]["wheel"]["sha256"]
    name = f"{digest[:12]}-{digest[12:20]}"
    assert release["current"] == release["release"] == name
    assert release["manifest"]["source"] == "wheel"

    refused = summary["cases"]["preflight"]["data"]["sliding_probe_false"]
    assert "dflash_sliding_window" in refused["msg"]

    synthetic = summary["cases"]["synthetic"]["data"]
    root = tmp_path / "opt" / "vllm"
    config = tmp_path / "etc" / "vllm" / "proof.yaml"
    # the role's ExecStart: `current` resolved once, the release's own cache root (moved under the state root)
    shell, flag, script = synthetic["exec_start"]
    assert (shell, flag) == ("/bin/sh", "-c")
    assert script.startswith(f"release=$(readlink -f {root}/current) && export VLLM_CACHE_ROOT=")
    assert f"{tmp_path / 'state'}/var/cache/vllm/proof/${{release##*/}}" in script
    assert script.endswith(f'exec "$release/venv/bin/vllm" serve --config {config} --shutdown-timeout 10')
    assert synthetic["gate"]["passed"] is True
    assert synthetic["gate"]["mean_acceptance_length"] == pytest.approx(3.0, abs=0.01)
    assert [round(rate, 2) for rate in synthetic["gate"]["per_position_acceptance"]] == [1, 1, 0, 0, 0, 0, 0]
    assert synthetic["stop"]["stopped"] is True

    random = summary["cases"]["random"]["data"]
    assert random["gate"]["passed"] is False
    assert "mean acceptance length" in random["gate_failure"]
    assert random["stop"]["stopped"] is True
    assert not (tmp_path / "base" / "out" / "server.pid").exists()

    # the fixture engine dies as vLLM does: exit status 0, which only Restart=always restarts
    death = summary["cases"]["engine_death"]["data"]
    assert death["exit_status"] == 0
    assert death["restarts_under"] == {"on-failure": False, "always": True}
    assert death["unit_restart"] == "always" and death["unit_would_restart"] is True
    assert death["request_in_flight"]["in_flight_at_kill"] is True
    assert death["request_in_flight"]["error_event"]["code"] == 500
    assert death["left_in_group"] == []


def test_the_staged_case_serves_the_snapshots_the_role_staged(tmp_path, engine_site):
    """Issue 17: target and drafter staged by dflash_config (source: path), served from their snapshots."""
    summary = run_proof(tmp_path, engine_site, PROOF_CASES="release facts preflight staged")[0]
    assert sorted(summary["cases"]) == ["facts", "preflight", "release", "staged"]
    staged = summary["cases"]["staged"]["data"]
    hub = tmp_path / "base" / "out" / "hf-home" / "hub"
    revision = "17a9e0c4d1b2f3a4e5d6c7b8a9f0e1d2c3b4a5f6"
    target = hub / "models--vllm-ops-test--tiny-qwen3" / "snapshots" / revision
    drafter = hub / "models--vllm-ops-test--tiny-qwen3-dflash" / "snapshots" / revision
    serve = staged["serve_yaml"]
    assert f"model: {target}\n" in serve and f"revision: {revision}\n" in serve
    assert f"model: {drafter}\n" in serve and serve.count(f"revision: {revision}") == 2
    # staged as the HF cache lays it out: snapshot files are links into the repo's blobs
    assert (target / "config.json").is_symlink() and (drafter / "config.json").is_symlink()
    assert staged["staged"]["models"]["drafter"]["commit"] == revision
    assert staged["staged"]["files"] == 2
    # offline from the unit's own Environment=: the case's env file holds no offline variable
    assert staged["start"]["env"]["HF_HUB_OFFLINE"] == "1"
    assert staged["start"]["env"]["HF_HUB_CACHE"] == str(hub)
    env_file = (tmp_path / "etc" / "vllm" / "proof.env").read_text()
    # the role's preflight judged the staged drafter's config.json, not the one it was copied from
    judged = json.loads((tmp_path / "etc" / "vllm" / "proof.drafter.json").read_text())["files"]
    assert list(judged) == [str(drafter / "config.json")]
    assert "HF_HUB_OFFLINE" not in env_file
    assert str(target) in staged["staged"]["args_lines"][0]
    assert staged["staged"]["unstaged_path_logged"] is False
    assert staged["gate"]["passed"] is True
    assert staged["gate"]["mean_acceptance_length"] == pytest.approx(3.0, abs=0.01)
