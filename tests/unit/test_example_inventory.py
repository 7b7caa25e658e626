"""The example inventory (playbooks/gpu_hosts) works on a fresh host (issue 27 item 2), checked so it cannot rot.

ansible-inventory parses it, the playbooks' syntax check passes with it, it stages both models at 40-hex commits
(the unit serves offline), and the vLLM it names - the release, or its tag - passes the preflight with the seed's
drafter on that release's own probe snippets and captured capabilities. The molecule scenario `example` deploys
from it (extensions/molecule/example).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils._preflight import preflight
from ansible_collections.vllm_ops.dflash.tests.helpers.capabilities import captured as capabilities
from helpers.playbook import IMPORT, INCLUDE, task_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "playbooks" / "gpu_hosts"
DATA = ROOT / "tests" / "unit" / "data"
BIN = Path(sys.executable).parent
ENV = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"), ANSIBLE_NOCOLOR="1")


@pytest.fixture(scope="module")
def inventory() -> Dict[str, Any]:
    proc = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(EXAMPLE), "--list"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def host_vars(inventory) -> Dict[str, Any]:
    hosts = inventory["gpu_hosts"]["hosts"]
    assert hosts, "the example inventory has no host in gpu_hosts"
    return inventory["_meta"]["hostvars"][hosts[0]]


def test_the_group_is_the_one_the_playbooks_target(inventory):
    assert len(inventory["gpu_hosts"]["hosts"]) >= 2  # a canary and the rest
    for playbook in ("deploy_dflash.yml", "rollback.yml"):
        plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
        assert any(play.get("hosts") == "gpu_hosts" for play in plays), playbook


def all_static(playbook: str, tmp_path: Path) -> Path:
    """The playbook with its plays' includes of its own task files made imports, as a copy in tmp_path: the syntax
    check parses an include only when it runs, so it would not read the deploy's build and rollout otherwise."""
    plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    for play in plays:
        for task in play.get("tasks") or []:
            path = task_file(task)
            if path is not None:
                task.pop(INCLUDE, None)
                task[IMPORT] = str(path)
    copy = tmp_path / playbook
    copy.write_text(yaml.safe_dump(plays, sort_keys=False))
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("playbook", ["deploy_dflash.yml", "rollback.yml"])
def test_the_playbooks_pass_the_syntax_check_with_it(playbook, tmp_path):
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "-i", str(EXAMPLE), str(all_static(playbook, tmp_path))],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_both_models_are_staged_at_commits_so_the_offline_unit_can_serve(host_vars):
    for name in ("vllm_target_model", "vllm_drafter_model"):
        model = host_vars[name]
        assert re.fullmatch(r"[0-9a-f]{40}", model["revision"]), (name, model)
        assert not model.get("allow_moving_revision")
    assert host_vars["vllm_drafter_model"]["repo_id"] == host_vars["vllm_speculative_config"]["model"]
    # The staged drafter's config.json is what the preflight reads: no path that a fresh host lacks.
    assert not host_vars.get("dflash_config_drafter_config")


def test_secrets_come_from_the_vault_example(host_vars):
    assert host_vars["vllm_api_key"] == "{{ vault_vllm_api_key }}"
    vault = yaml.safe_load((EXAMPLE / "group_vars" / "gpu_hosts" / "vault.yml.example").read_text())
    assert "vault_vllm_api_key" in vault
    # A real vault.yml beside it is the user's, never shipped.
    assert not (EXAMPLE / "group_vars" / "gpu_hosts" / "vault.yml").exists()


def _probed(version: str) -> Dict[str, bool]:
    probes = yaml.safe_load((DATA / "probes.yml").read_text())["vllm_probes"]
    snippets = DATA / "vllm_snippets" / version
    return {p["name"]: bool(re.search(p["pattern"], (snippets / (p["path"] + ".txt")).read_text())) for p in probes}


def test_the_vllm_it_names_passes_the_preflight_with_the_seeds_drafter(host_vars):
    version = host_vars.get("vllm_version") or host_vars["vllm_ref"].removeprefix("v")
    # The ref, where the release path is not used, is that release's tag of upstream vLLM.
    assert host_vars["vllm_ref"] == f"v{version}"
    assert "refs/pull/40898" not in host_vars["vllm_ref"]  # docs/probes.md: most likely refused
    assert (DATA / "vllm_snippets" / version).is_dir(), f"no probe snippets of vLLM {version}: add them or pick one"
    facts = {"version": version, "probes": _probed(version), "capabilities": capabilities(version)}
    drafter = json.loads((DATA / "drafters" / "qwen36_dflash.json").read_text())  # shaped like z-lab's
    result = preflight(
        host_vars["vllm_speculative_config"],
        drafter_config=drafter,
        vllm_facts=facts,
        tensor_parallel_size=host_vars["vllm_tensor_parallel_size"],
    )
    assert result["error_count"] == 0, result["findings"]
    assert result["speculative_config"]["num_speculative_tokens"] == drafter["block_size"] - 1
