# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""execution-environment.yml: pins that agree with the test tools, and a build context that
`ansible-builder create` writes from it (no image pulled). `make ee` does the same on the real tarball."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EE = ROOT / "execution-environment.yml"


def builder():
    """ansible-builder of this venv (requirements-test.txt), or $ANSIBLE_BUILDER."""
    found = os.environ.get("ANSIBLE_BUILDER") or shutil.which("ansible-builder", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("ansible-builder is not installed (requirements-test.txt; or set ANSIBLE_BUILDER)")
    return found


def pin(text, name):
    match = re.search(rf"^{re.escape(name)}==(\S+)", text, re.MULTILINE)
    assert match, f"{name} is not pinned"
    return match.group(1)


def test_ansible_core_is_pinned_to_the_tested_version():
    definition = yaml.safe_load(EE.read_text())
    assert definition["version"] == 3
    tested = pin((ROOT / "requirements-test.txt").read_text(), "ansible-core")
    assert definition["dependencies"]["ansible_core"]["package_pip"] == f"ansible-core=={tested}"
    assert re.fullmatch(r"ansible-runner==[0-9.]+", definition["dependencies"]["ansible_runner"]["package_pip"])


def test_the_galaxy_requirement_is_the_file_the_build_files_place():
    definition = yaml.safe_load(EE.read_text())
    (build_file,) = definition["additional_build_files"]
    (collection,) = definition["dependencies"]["galaxy"]["collections"]
    assert collection["type"] == "file"
    assert collection["name"] == f"{build_file['dest']}/{Path(build_file['src']).name}"


def test_the_collection_declares_its_own_needs_for_introspection():
    declared = yaml.safe_load((ROOT / "meta" / "execution-environment.yml").read_text())["dependencies"]
    for key in ("python", "system"):
        assert (ROOT / declared[key]).is_file(), declared[key]
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert not any(pattern.startswith("meta") for pattern in galaxy["build_ignore"])  # they ship in the tarball


def test_ansible_builder_create_writes_the_build_context(tmp_path):
    # A stand-in tarball: `create` copies it into the context, it does not open it.
    source = tmp_path / "src"
    definition = yaml.safe_load(EE.read_text())
    (build_file,) = definition["additional_build_files"]
    tarball = source / build_file["src"]
    tarball.parent.mkdir(parents=True)
    with tarfile.open(tarball, "w:gz"):
        pass
    shutil.copy(EE, source / EE.name)
    context = tmp_path / "context"
    done = subprocess.run(
        [builder(), "create", "-f", str(source / EE.name), "-c", str(context), "--output-filename", "Containerfile"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    containerfile = (context / "Containerfile").read_text()
    tested = pin((ROOT / "requirements-test.txt").read_text(), "ansible-core")
    assert f'ARG ANSIBLE_INSTALL_REFS="ansible-core=={tested} ' in containerfile
    assert "ansible-galaxy collection install" in containerfile
    assert "introspect" in containerfile  # the collection's meta/execution-environment.yml is read in the build
    placed = context / "_build" / build_file["dest"] / tarball.name
    assert placed.read_bytes() == tarball.read_bytes()
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert requirements["collections"] == definition["dependencies"]["galaxy"]["collections"]


def test_introspection_finds_the_collections_system_needs(tmp_path):
    done = subprocess.run(
        [builder(), "introspect", str(ROOT / ".cache" / "ac")], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = yaml.safe_load(done.stdout.split("\n", 1)[1])  # after the "# Dependency data" line
    assert any(line.startswith("openssh-clients [platform:rpm]") for line in found["system"])
