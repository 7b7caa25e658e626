# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_prerequisites run as Ansible runs it: every problem in one failure, or returned with fail=false."""

from __future__ import annotations

import re
import sys

from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner


def run_module(tmp_path, **args):
    return module_runner.run_module("vllm_prerequisites", tmp_path, args)[0]


def test_the_problems_fail_once_naming_each_fix(tmp_path):
    args = dict(python="python3.99-not-here", root=str(tmp_path / "r"), git=False, cuda="", min_free_gb=10**9)
    failed = run_module(tmp_path, **args)
    assert failed["failed"] is True and failed["changed"] is False
    assert [p["name"] for p in failed["problems"]] == ["python", "disk"]
    assert failed["msg"].startswith("2 prerequisite(s) missing on this host, nothing was built or changed: (1) ")
    returned = run_module(tmp_path, fail=False, **args)
    assert returned.get("failed") is not True

    # The same problems; the free-space figure in the disk problem's text moves with whatever else writes
    # to this disk between the two runs, so figures are masked before the texts are compared.
    def masked(found):
        return [dict(p, msg=re.sub(r"\d+(\.\d+)?", "N", p["msg"])) for p in found]

    assert masked(returned["problems"]) == masked(failed["problems"])
    assert not (tmp_path / "r").exists()


def test_a_ready_host_passes_and_says_what_it_read(tmp_path):
    result = run_module(tmp_path, python=sys.executable, root=str(tmp_path), git=False, cuda="", min_free_gb=0)
    assert result.get("failed") is not True, result.get("msg")
    assert result["problems"] == [] and result["packages"] == []
    assert result["observed"]["python_version"] == list(sys.version_info[:2])


def test_a_cuda_that_is_no_version_is_refused(tmp_path):
    result = run_module(tmp_path, python=sys.executable, root=str(tmp_path), cuda="latest")
    assert result["failed"] is True and "vllm_prerequisites_cuda='latest' is not a CUDA version" in result["msg"]
