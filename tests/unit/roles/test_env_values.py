"""Env values that would add lines to the env file (issue 28 case 8).

A newline in an env value (vllm_extra_env, the API key, the HF token) gave the service's env file lines of
the caller's choosing (LD_PRELOAD=..., PYTHONPATH=...). Runs dflash_config's controller-only entry point
(expected_files, the deploy's look) in a one-task play on localhost: nothing is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.role_play import run_entry_point as _play

ROOT = Path(__file__).resolve().parents[3]
SECRET = "hf_secret_value_do_not_print"


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
