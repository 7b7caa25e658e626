"""Tags on every role task (issue 18 item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
# The tag of each role; tasks_from: rollback is the rollback's own (and always: the rescue must run it).
TAGS = {"vllm_install": "install", "dflash_config": "config", "vllm_service": "service", "dflash_gate": "gate"}
TAGS["dflash_monitoring"] = "monitoring"
FILE_TAGS = {("dflash_gate", "rollback.yml"): "rollback"}
TASK_FILES = sorted((ROOT / "roles").glob("*/tasks/*.yml"))


def untagged(path: Path, tag: str) -> list[str]:
    """Top-level tasks without `tag` (a block's tasks inherit its tags, an included file's are checked here)."""
    return [str(task.get("name")) for task in yaml.safe_load(path.read_text()) if tag not in task.get("tags", [])]


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: f"{p.parts[-3]}/{p.name}")
def test_every_role_task_carries_its_tag(path):
    role = path.parts[-3]
    tag = FILE_TAGS.get((role, path.name), TAGS[role])
    assert untagged(path, tag) == [], f"{role}/tasks/{path.name}: add tags: [{tag}] to these tasks"


def test_the_check_finds_an_untagged_task(tmp_path):
    tasks = tmp_path / "main.yml"
    tasks.write_text("- name: Tagged\n  tags: [install]\n  block: []\n- name: Bare\n  ansible.builtin.debug: {}\n")
    assert untagged(tasks, "install") == ["Bare"]
