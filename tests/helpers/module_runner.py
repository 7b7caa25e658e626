"""Run a module of this collection as Ansible runs it: a subprocess that reads ANSIBLE_MODULE_ARGS from a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Tuple

COLLECTIONS = Path(__file__).resolve().parents[2] / ".cache" / "ac"


def run_module(
    name: str,
    tmp_path: Path,
    args: Mapping[str, Any],
    check_mode: bool = False,
    diff: bool = False,
    timeout: float = 120,
) -> Tuple[Dict[str, Any], subprocess.CompletedProcess]:
    """The module's JSON result and the finished process; a failed result always comes with rc != 0."""
    args_file = tmp_path / "args.json"
    payload = {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    argv = [sys.executable, "-m", f"ansible_collections.vllm_ops.dflash.plugins.modules.{name}", str(args_file)]
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert proc.stdout, proc.stderr
    result: Dict[str, Any] = json.loads(proc.stdout)
    assert (proc.returncode != 0) == bool(result.get("failed")), proc.stderr
    return result, proc
