"""The env file (HF token, API key) is never readable by others, not even while it is being created.

Issue 14 item 6: Ansible's atomic_move renames the new file into place and applies `mode` after the
rename, so a file created by the template (or the gate's `.env.last-good` copy) was 0644 for a moment.
The module's python is wrapped so that every rename onto an env file records the mode the file has at
that instant: the window is observed exactly, not raced for.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COLLECTIONS = ROOT / ".cache" / "ac"
BIN = Path(sys.executable).parent

SITECUSTOMIZE = textwrap.dedent(
    """
    import json, os
    _rename, _replace = os.rename, os.replace
    def _record(src, dst):
        name = os.fsdecode(dst)
        if ".env" in os.path.basename(name):
            mode = os.stat(src).st_mode & 0o777
            with open(os.environ["MODE_LOG"], "a") as log:
                log.write(json.dumps({"dest": name, "mode": mode}) + "\\n")
    def rename(src, dst, *a, **k):
        _record(src, dst)
        return _rename(src, dst, *a, **k)
    def replace(src, dst, *a, **k):
        _record(src, dst)
        return _replace(src, dst, *a, **k)
    os.rename, os.replace = rename, replace
    """
)

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    vllm_config_dir: {config}
    vllm_root: {root}
    vllm_instance: t
    vllm_api_key: api-key-do-not-leak
    vllm_hf_token: hf_token_do_not_leak
    vllm_speculative_config: {{}}
    dflash_gate_enabled: false
  tasks:
    - ansible.builtin.import_role:
        name: vllm_ops.dflash.dflash_config
    - ansible.builtin.import_role:
        name: vllm_ops.dflash.dflash_gate
"""


@pytest.mark.slow
def test_env_files_are_0600_from_their_creation(tmp_path):
    if os.geteuid() != 0:
        import pytest

        pytest.skip("the roles set owner root")
    wrapper_dir = tmp_path / "site"
    wrapper_dir.mkdir()
    (wrapper_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={wrapper_dir} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    config, root, log = tmp_path / "etc-vllm", tmp_path / "opt-vllm", tmp_path / "modes.jsonl"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(config=config, root=root))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_PYTHON_INTERPRETER=str(python),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
        MODE_LOG=str(log),
    )
    for run in (1, 2):  # created, then replaced (a changed secret)
        extra = ["-e", json.dumps({"vllm_api_key": f"api-key-{run}"})]
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    renames = [json.loads(line) for line in log.read_text().splitlines()]
    destinations = {Path(r["dest"]).name for r in renames}
    assert {"t.env", "t.env.last-good"} <= destinations, renames
    assert all(r["mode"] == 0o600 for r in renames), [r for r in renames if r["mode"] != 0o600]
    for name in ("t.env", "t.env.last-good"):
        assert stat.S_IMODE((config / name).stat().st_mode) == 0o600
