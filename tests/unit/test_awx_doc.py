# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""docs/awx.md's workflow example: valid YAML, playbooks that exist, and the graph the text describes."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "awx.md"


def example():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    (play,) = yaml.safe_load(blocks[0])
    return play


def task(play, action):
    (found,) = [t for t in play["tasks"] if action in t]
    return found


def test_the_job_templates_run_playbooks_of_this_collection():
    templates = task(example(), "awx.awx.job_template")
    playbooks = {item["playbook"] for item in templates["loop"]}
    templates = templates["awx.awx.job_template"]
    assert playbooks == {"playbooks/deploy_dflash.yml", "playbooks/rollback.yml"}
    assert all((ROOT / playbook).is_file() for playbook in playbooks)
    assert templates["ask_limit_on_launch"] and templates["ask_variables_on_launch"]  # the nodes set limit / vars


def test_the_workflow_is_canary_approval_fleet_with_failures_to_rollback():
    workflow = task(example(), "awx.awx.workflow_job_template")["awx.awx.workflow_job_template"]
    nodes = {node["identifier"]: node for node in workflow["workflow_nodes"]}

    def edges(name, kind):
        return [edge["identifier"] for edge in nodes[name].get("related", {}).get(kind, [])]

    assert nodes["canary"]["limit"] == "canary"
    assert edges("canary", "success_nodes") == ["approval"]
    assert nodes["approval"]["unified_job_template"]["type"] == "workflow_approval"
    assert edges("approval", "success_nodes") == ["fleet"]
    assert "limit" not in nodes["fleet"]
    for name in ("canary", "approval", "fleet"):
        assert edges(name, "failure_nodes") == ["rollback"], name
    assert nodes["rollback"]["unified_job_template"]["name"] == "vllm-dflash rollback"
    (question,) = workflow["survey_spec"]["spec"]
    assert question["variable"] == "vllm_rollback_release"  # rollback.yml's explicit target
    assert "vllm_rollback_release" in (ROOT / "playbooks" / "rollback.yml").read_text()
