# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dflash_config role run by ansible-playbook on localhost: what it writes, and what the deploy's look
(the controller-only expected_files entry point) expects of it.

The facts are vllm_facts' own, of a venv whose vllm is the fixture engine (tests/helpers/engine_venv.py):
its capabilities come from the engine's config, registry and `vllm serve` parser, as from a real release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drift import FileExpectation
from ansible_collections.vllm_ops.dflash.tests.helpers.engine_venv import engine_venv

pytestmark = pytest.mark.slow  # every test runs ansible-playbook
ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent / "dflash_config"
DRAFTER = ROOT / "tests" / "unit" / "data" / "drafters" / "tiny_dflash.json"  # block_size 8
PROBES = yaml.safe_load((ROOT / "tests" / "unit" / "data" / "probes.yml").read_text())["vllm_probes"]


def play(tmp_path: Path, **extra: Any) -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    if not venv.exists():
        engine_venv(venv)
    variables: Dict[str, Any] = {
        "role_test_venv": str(venv),
        "role_test_probes": PROBES,
        "role_test_out": str(tmp_path / "expected.json"),
        "vllm_config_dir": str(tmp_path / "etc"),
        "vllm_model": "fixture/tiny-qwen3",
        "vllm_served_model_name": "tiny",
        # no num_speculative_tokens: the preflight fills in block_size - 1 = 7
        "vllm_speculative_config": {"method": "dflash", "model": "/srv/models/tiny-dflash"},
        "dflash_config_drafter_config": str(DRAFTER),
        "ansible_python_interpreter": sys.executable,
    }
    variables.update(extra)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
        ANSIBLE_NOCOLOR="1",
    )
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    argv += [str(HERE / "play.yml"), "-e", json.dumps(variables)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("dflash-config")
    proc = play(tmp_path, vllm_serve_extra_args={"enable-prefix-caching": False, "no-enforce-eager": False})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return tmp_path


def test_booleans_are_written_the_way_vllm_honours_them(configured):
    serve = yaml.safe_load((configured / "etc" / "default.yaml").read_text())
    assert serve["no-enable-prefix-caching"] is True and "enable-prefix-caching" not in serve
    assert serve["enforce-eager"] is True and "no-enforce-eager" not in serve
    assert False not in serve.values()


def test_the_written_config_is_the_normalised_one(configured):
    serve = yaml.safe_load((configured / "etc" / "default.yaml").read_text())
    assert serve["speculative-config"] == {
        "method": "dflash",
        "model": "/srv/models/tiny-dflash",
        "num_speculative_tokens": 7,
    }


def test_the_look_sees_a_config_the_preflight_filled_in_as_unchanged(configured):
    expected = json.loads((configured / "expected.json").read_text())
    assert [Path(item["path"]).name for item in expected] == ["default.yaml", "default.env"]
    for item in expected:
        assert FileExpectation.from_dict(item).difference() is None, item
    # The controller's render alone differs from the file: without the host's render record the look could not tell.
    serve = expected[0]
    assert FileExpectation.from_dict({"path": serve["path"], "sha256": serve["sha256"]}).difference() is not None
    record = json.loads((configured / "etc" / "default.render.json").read_text())
    assert record["input_sha256"] == serve["input_sha256"] and record["path"] == serve["path"]


def test_the_same_config_written_out_in_full_in_another_order_gives_the_same_file(configured, tmp_path):
    """The preflight appends the K it fills in; the file must not depend on where a key came from."""
    explicit = {"num_speculative_tokens": 7, "model": "/srv/models/tiny-dflash", "method": "dflash"}
    proc = play(
        tmp_path,
        vllm_speculative_config=explicit,
        vllm_serve_extra_args={"enable-prefix-caching": False, "no-enforce-eager": False},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    def body(path: Path) -> list:
        return [line for line in path.read_text().splitlines() if not line.startswith("#")]

    assert body(tmp_path / "etc" / "default.yaml") == body(configured / "etc" / "default.yaml")


def test_an_unknown_serve_flag_is_refused_before_any_file_is_written(tmp_path):
    proc = play(tmp_path, vllm_serve_extra_args={"enable-prefix-cachin": True})
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "--enable-prefix-cachin is not a flag of vLLM 0.33.0" in out and "rename it enable-prefix-caching" in out
    assert not (tmp_path / "etc").exists()


def pinned(tmp_path: Path, drafter_checksums: Dict[str, str]) -> Dict[str, Any]:
    """Variables for a target staged from a host directory and a drafter from a controller directory."""
    target = tmp_path / "host-copy"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (target / "model.safetensors").write_bytes(b"\x01" * 4096)
    drafter = tmp_path / "controller-copy"
    drafter.mkdir(exist_ok=True)
    (drafter / "config.json").write_bytes(DRAFTER.read_bytes())
    return {
        "vllm_hf_home": str(tmp_path / "hf"),
        "vllm_model": "fixture/tiny-qwen3",  # the target's repo id by default
        "vllm_target_model": {
            "revision": "a" * 40,
            "source": "path",
            "path": str(target),
        },
        "vllm_drafter_model": {
            "repo_id": "fixture/tiny-dflash",
            "revision": "b" * 40,
            "controller_path": str(drafter),
            "checksums": drafter_checksums,
        },
        "vllm_speculative_config": {"method": "dflash"},
        "vllm_served_model_name": "",
        "dflash_config_drafter_config": "",
    }


def test_pinned_models_are_staged_and_served_from_their_snapshots(tmp_path):
    import hashlib

    from ansible_collections.vllm_ops.dflash.plugins.module_utils._drift import recorded_differences

    sums = {"config.json": hashlib.sha256(DRAFTER.read_bytes()).hexdigest()}
    proc = play(tmp_path, **pinned(tmp_path, sums))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    hub = tmp_path / "hf" / "hub"
    target = hub / "models--fixture--tiny-qwen3" / "snapshots" / ("a" * 40)
    drafter = hub / "models--fixture--tiny-dflash" / "snapshots" / ("b" * 40)
    serve = yaml.safe_load((tmp_path / "etc" / "default.yaml").read_text())
    assert (serve["model"], serve["revision"], serve["served-model-name"]) == (
        str(target),
        "a" * 40,
        "fixture/tiny-qwen3",
    )
    assert serve["speculative-config"] == {
        "method": "dflash",
        "model": str(drafter),
        "revision": "b" * 40,
        "num_speculative_tokens": 7,  # the preflight read the staged drafter config.json
    }
    # The staged commits are the role's output, which the gate's identity takes (one pin).
    result = json.loads((tmp_path / "expected.json.result.json").read_text())
    assert (result["target_revision"], result["drafter_revision"]) == ("a" * 40, "b" * 40)
    passed = json.loads((tmp_path / "etc" / "default.drafter.json").read_text())["files"]
    assert list(passed) == [str(drafter / "config.json")]
    # The look: the controller knows the snapshot paths of pinned commits, and the record covers every file.
    expected = json.loads((tmp_path / "expected.json").read_text())
    for item in expected:
        assert FileExpectation.from_dict(item).difference() is None, item
    record = tmp_path / "etc" / "default.models.json"
    assert sorted(json.loads(record.read_text())["files"]) == sorted(
        [str(target / "config.json"), str(target / "model.safetensors"), str(drafter / "config.json")]
    )
    assert recorded_differences(str(record)) == []
    (target / "model.safetensors").resolve().write_bytes(b"\x02" * 4096)  # changed in place
    assert recorded_differences(str(record)) == [
        f"{target / 'model.safetensors'} changed since it was recorded in {record}"
    ]


def test_a_pinned_model_with_a_wrong_checksum_is_refused_before_any_config_file(tmp_path):
    proc = play(tmp_path, **pinned(tmp_path, {"config.json": "0" * 64}))
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert f"fixture/tiny-dflash at revision {'b' * 40}" in out and "config.json has sha256" in out
    assert not (tmp_path / "etc").exists()
    assert not (tmp_path / "hf" / "hub").exists()  # checked before anything is copied, the target included
