"""Renamed modules keep their old name working (meta/runtime.yml plugin_routing), with a deprecation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROUTING = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["plugin_routing"]["modules"]


def test_every_old_name_redirects_to_a_module_and_says_when_it_goes():
    for old, route in ROUTING.items():
        assert not (ROOT / "plugins" / "modules" / f"{old}.py").exists(), f"{old} is both a module and a redirect"
        namespace, name, target = route["redirect"].split(".")
        assert (namespace, name) == ("vllm_ops", "dflash")
        assert (ROOT / "plugins" / "modules" / f"{target}.py").exists(), f"{old} redirects to a missing {target}"
        assert route["deprecation"]["removal_version"] and route["deprecation"]["warning_text"]


def test_ansible_doc_finds_dflash_drift_under_its_new_name():
    doc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-t", "module", "-j", "vllm_ops.dflash.dflash_drift"],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac")),
    )
    assert "vllm_ops.dflash.vllm_drift" in doc.stdout
    assert "deprecated" in doc.stderr
