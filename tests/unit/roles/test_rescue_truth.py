"""The deploy's rescue says the truth (issue 28 cases 4 and 13).

The role dflash_rollback runs whole, as the deploy's rescue includes it, on localhost against a stand-in
`systemctl` (it logs what it is asked and answers `show` as a loaded, active, enabled unit) and a release
root of the test's own. Case 4: no good release on record (state.json moved aside, as its own error message
advises) and the failed release B is what served: B must be marked failed and the play must say that nothing
serves. Case 13: the last good serve config of A is missing: the rescue must fail naming it, before it
moves `current` or restarts anything, never "rolled back".
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
A, B = "aaaaaaaaaaaa-00000000", "bbbbbbbbbbbb-11111111"

SYSTEMCTL = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  show) printf 'Id=%s\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\nUnitFileState=enabled\\n' "$2" ;;
  is-enabled) echo enabled ;;
  is-active) echo active ;;
esac
exit 0
"""


def _release(root: Path, name: str) -> None:
    (root / "releases" / name).mkdir(parents=True)
    manifest = {"schema": 1, "commit": name[0] * 40}
    (root / "releases" / name / "manifest.json").write_text(json.dumps(manifest))


def _rescue(tmp_path: Path, kept: list, reason: str, **rescue_vars: object) -> subprocess.CompletedProcess:
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir(exist_ok=True)
    (stand_ins / "systemctl").write_text(SYSTEMCTL.format(log=tmp_path / "systemctl.log"))
    (stand_ins / "systemctl").chmod(0o755)
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [
            {
                "ansible.builtin.include_role": {"name": "vllm_ops.dflash.dflash_rollback"},
                "vars": {"dflash_rollback_reason": reason, **rescue_vars},
            }
        ],
    }
    (tmp_path / "rescue.yml").write_text(yaml.safe_dump([play]))
    # Extra vars: the kept files under the test's directory (the role's vars name /etc/systemd/system).
    extra = {
        "vllm_root": str(tmp_path / "vllm"),
        "vllm_config_dir": str(tmp_path / "etc"),
        "vllm_instance": "t",
        "vllm_kept_files": kept,
        # The old rescue restarted and waited for a server that is not there: bounded here.
        "vllm_ready_timeout": 4,
    }
    env = dict(
        os.environ,
        PATH=f"{stand_ins}:{os.environ['PATH']}",
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
        ANSIBLE_NOCOLOR="1",
    )
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "rescue.yml", "-e", json.dumps(extra)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)


def _kept(tmp_path: Path) -> list:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    return [
        {"path": str(etc / "t.yaml"), "last_good": str(etc / "t.yaml.last-good"), "mode": "0644"},
        {"path": str(etc / "t.env"), "last_good": str(etc / "t.env.last-good"), "mode": "0600", "secret": True},
        {"path": str(etc / "vllm-t.service"), "last_good": str(etc / "vllm-t.service.last-good"), "mode": "0644"},
    ]


def _full(kept: list, optional_unit: bool = True) -> list:
    for item in kept:
        item.setdefault("secret", False)
        item.setdefault("optional", item["path"].endswith(".service") and optional_unit)
    return kept


@pytest.mark.slow
def test_no_good_release_on_record_marks_the_failed_release_and_says_nothing_serves(tmp_path):
    root = tmp_path / "vllm"
    _release(root, B)
    (root / "current").symlink_to(f"releases/{B}")  # state.json moved aside: B is all there is
    proc = _rescue(
        tmp_path,
        _full(_kept(tmp_path)),
        "Gate on the acceptance length failed: mean acceptance length 1.00 < 2.0",
        dflash_rollback_failed_release=B,
        dflash_rollback_fallback=B,  # what served when the run began: the unfinished B
        dflash_rollback_needed=False,
        dflash_rollback_gate_failed=True,
    )
    out = proc.stdout
    assert proc.returncode == 2, out[-4000:] + proc.stderr[-2000:]
    assert "keeps serving" not in out, out[-4000:]
    assert f"{B} is marked failed" in out and "nothing serves" in out, out[-4000:]
    state = json.loads((root / "state.json").read_text())
    assert state["releases"][B]["status"] == "failed"
    calls = (tmp_path / "systemctl.log").read_text().splitlines()
    assert "stop vllm-t.service" in calls and "disable vllm-t.service" in calls, calls


@pytest.mark.slow
def test_a_failed_rollout_that_changed_nothing_says_which_ungated_release_keeps_serving(tmp_path):
    # B served (never gated: gates were off) and this run's preflight refused before any change.
    root = tmp_path / "vllm"
    _release(root, B)
    (root / "current").symlink_to(f"releases/{B}")
    proc = _rescue(
        tmp_path,
        _full(_kept(tmp_path)),
        "Check the serve config failed: unknown flag",
        dflash_rollback_failed_release=B,
        dflash_rollback_fallback=B,
        dflash_rollback_needed=False,
        dflash_rollback_gate_failed=False,
    )
    out = proc.stdout
    assert proc.returncode == 2, out[-4000:] + proc.stderr[-2000:]
    assert f"{B} keeps serving (it never passed a gate here" in out, out[-4000:]
    assert not (tmp_path / "systemctl.log").exists() or "stop" not in (tmp_path / "systemctl.log").read_text()


@pytest.mark.slow
def test_a_missing_last_good_config_fails_the_rescue_before_anything_moves(tmp_path):
    root = tmp_path / "vllm"
    _release(root, A)
    _release(root, B)
    (root / "current").symlink_to(f"releases/{B}")
    (root / "state.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "current": B,
                "previous": A,
                "releases": {
                    A: {"commit": "a" * 40, "status": "good", "created_at": "2026-01-01T00:00:00Z"},
                    B: {"commit": "b" * 40, "status": "active", "created_at": "2026-01-02T00:00:00Z"},
                },
                "history": [],
            }
        )
    )
    kept = _full(_kept(tmp_path))
    etc = tmp_path / "etc"
    (etc / "t.yaml").write_text("port: 9999\n")  # B's config
    (etc / "t.env").write_text("VLLM_API_KEY=b\n")
    (etc / "t.env.last-good").write_text("VLLM_API_KEY=a\n")
    # t.yaml.last-good is gone: A would restart with B's config
    proc = _rescue(
        tmp_path,
        kept,
        "Gate on the acceptance length failed: mean acceptance length 1.00 < 2.0",
        dflash_rollback_failed_release=B,
        dflash_rollback_fallback=A,
        dflash_rollback_needed=True,
        dflash_rollback_gate_failed=True,
    )
    out = proc.stdout
    assert proc.returncode == 2, out[-4000:] + proc.stderr[-2000:]
    assert "-> rolled back to" not in out, out[-4000:]
    assert f"cannot roll back to {A}" in out and str(etc / "t.yaml.last-good") in out, out[-4000:]
    assert os.readlink(root / "current") == f"releases/{B}", "current moved although the rollback was refused"
    assert (etc / "t.yaml").read_text() == "port: 9999\n"
    calls = (tmp_path / "systemctl.log").read_text().splitlines() if (tmp_path / "systemctl.log").exists() else []
    assert not [call for call in calls if call.split()[:1] in (["restart"], ["start"])], calls
    assert "VLLM_API_KEY" not in out, "a secret file's content reached the output"


@pytest.mark.slow
def test_a_restore_that_fails_after_the_swap_fails_the_rescue_before_the_restart(tmp_path):
    root = tmp_path / "vllm"
    _release(root, A)
    _release(root, B)
    (root / "current").symlink_to(f"releases/{B}")
    (root / "state.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "current": B,
                "previous": A,
                "releases": {
                    A: {"commit": "a" * 40, "status": "good", "created_at": "2026-01-01T00:00:00Z"},
                    B: {"commit": "b" * 40, "status": "active", "created_at": "2026-01-02T00:00:00Z"},
                },
                "history": [],
            }
        )
    )
    kept = _full(_kept(tmp_path))
    etc = tmp_path / "etc"
    for name, text in (("t.yaml", "port: 9999\n"), ("t.yaml.last-good", "port: 8000\n")):
        (etc / name).write_text(text)
    (etc / "t.env").write_text("VLLM_API_KEY=b\n")
    (etc / "t.env.last-good").write_text("VLLM_API_KEY=a\n")
    # The unit's copy exists, but its destination cannot be written (its directory is gone).
    kept[2]["path"] = str(tmp_path / "gone" / "vllm-t.service")
    (etc / "vllm-t.service.last-good").write_text("[Service]\n")
    proc = _rescue(
        tmp_path,
        kept,
        "Gate on the acceptance length failed: mean acceptance length 1.00 < 2.0",
        dflash_rollback_failed_release=B,
        dflash_rollback_fallback=A,
        dflash_rollback_needed=True,
        dflash_rollback_gate_failed=True,
    )
    out = proc.stdout
    assert proc.returncode == 2, out[-4000:] + proc.stderr[-2000:]
    assert "-> rolled back to" not in out, out[-4000:]
    assert "could not be restored" in out and kept[2]["path"] in out, out[-4000:]
    assert "the server was not restarted" in out, out[-4000:]
    assert os.readlink(root / "current") == f"releases/{A}"
    calls = (tmp_path / "systemctl.log").read_text().splitlines() if (tmp_path / "systemctl.log").exists() else []
    assert not [call for call in calls if call.split()[:1] in (["restart"], ["start"])], calls
    assert "VLLM_API_KEY" not in out, "a secret file's content reached the output"
