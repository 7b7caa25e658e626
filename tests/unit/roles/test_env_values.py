"""Env values that would add lines to the env file (issue 28 case 8).

A newline in an env value (vllm_extra_env, the API key, the HF token) gave the service's env file lines of
the caller's choosing (LD_PRELOAD=..., PYTHONPATH=...). Runs dflash_config's controller-only entry point
(expected_files, the deploy's look) in a one-task play on localhost: nothing is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
COLLECTIONS = ROOT / ".cache" / "ac"
BIN = Path(sys.executable).parent
SECRET = "hf_secret_value_do_not_print"


def _play(tmp_path: Path, role: str, entry: str, extra: dict) -> subprocess.CompletedProcess:
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.import_role": {"name": f"vllm_ops.dflash.{role}", "tasks_from": entry}}],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_NOCOLOR="1",
    )
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "play.yml", "-e", json.dumps(extra)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"vllm_extra_env": {"FOO": f"{SECRET}\nLD_PRELOAD=/tmp/evil.so"}}, "vllm_extra_env.FOO"),
        ({"vllm_extra_env": {"FOO": f"{SECRET}\rPYTHONPATH=/tmp"}}, "vllm_extra_env.FOO"),
        ({"vllm_extra_env": {"FOO\nLD_PRELOAD": SECRET}}, "a vllm_extra_env name (FOO?LD_PRELOAD)"),
        ({"vllm_api_key": f"{SECRET}\nLD_PRELOAD=/tmp/evil.so"}, "vllm_api_key"),
        ({"vllm_hf_token": f"{SECRET}\nPYTHONPATH=/tmp"}, "vllm_hf_token"),
    ],
    ids=["extra-env-newline", "extra-env-cr", "extra-env-name", "api-key", "hf-token"],
)
def test_an_env_value_with_a_line_break_is_refused_naming_the_variable_never_the_value(tmp_path, extra, named):
    proc = _play(tmp_path, "dflash_config", "expected_files", {"vllm_config_dir": str(tmp_path / "etc"), **extra})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert named in out and "line break" in out, out[-3000:]
    assert SECRET not in out, "the value reached the output"


@pytest.mark.slow
def test_plain_env_values_pass(tmp_path):
    extra = {"vllm_config_dir": str(tmp_path / "etc"), "vllm_api_key": "k-1", "vllm_extra_env": {"NCCL_DEBUG": "WARN"}}
    proc = _play(tmp_path, "dflash_config", "expected_files", extra)
    assert proc.returncode == 0, proc.stdout[-3000:]
