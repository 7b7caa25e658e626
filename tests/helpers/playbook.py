"""The collection's playbooks as ansible-playbook runs them, for tests that read their tasks.

deploy_dflash.yml's build and rollout plays include their tasks from playbooks/tasks/ (so that a no-op run never
parses them): `plays` opens such an include up, so a test reads the tasks that run wherever they are written,
and `files` names every file a playbook's tasks are written in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import yaml

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
INCLUDE = "ansible.builtin.include_tasks"
IMPORT = "ansible.builtin.import_tasks"


def task_file(task: dict, base: Path = PLAYBOOKS) -> Optional[Path]:
    """The playbook's own task file (a literal tasks/... path) a task includes or imports, else None."""
    for key in (INCLUDE, IMPORT):
        spec = task.get(key)
        name = spec.get("file") if isinstance(spec, dict) else spec
        if isinstance(name, str) and name.startswith("tasks/") and "{{" not in name:
            return base / name
    return None


def opened(tasks: List[dict], base: Path = PLAYBOOKS) -> List[dict]:
    """A play's tasks with each include of one of the playbook's task files replaced by that file's tasks."""
    found: List[dict] = []
    for task in tasks or []:
        path = task_file(task, base) if INCLUDE in task else None
        found.extend(yaml.safe_load(path.read_text()) if path else [task])
    return found


def plays(name: str, base: Path = PLAYBOOKS) -> Dict[str, dict]:
    """play name -> play of playbooks/<name>, its included task files opened up."""
    loaded = yaml.safe_load((base / name).read_text())
    for play in loaded:
        play["tasks"] = opened(play.get("tasks") or [], base)
    return {play["name"]: play for play in loaded}


def files(name: str, base: Path = PLAYBOOKS) -> List[Path]:
    """playbooks/<name> and the task files of its own that its plays include or import, in that order."""
    found = [base / name]
    for play in yaml.safe_load((base / name).read_text()):
        for task in play.get("tasks") or []:
            path = task_file(task, base)
            if path and path not in found:
                found.append(path)
    return found
