"""The built collection (issue 27 item 4): its licence text, no made-up URLs, and docs whose links hold.

galaxy.yml's build_ignore leaves parts of the tree out of the artifact (docs/gpu-runs, the fixture engine):
a shipped .md that links there is a dead link for everyone who installs the collection. The check builds the
artifact with ansible-galaxy and resolves every relative link of every .md inside the tarball.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from helpers.playbook import files

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# [text](target "title") and reference definitions [label]: target
INLINE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def relative_links(markdown: str) -> list[str]:
    text = FENCE.sub("", markdown)
    links = INLINE.findall(text) + REFERENCE.findall(text)
    return [link for link in links if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", link) and not link.startswith("#")]


def dead_links(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as tar:
        names = {posixpath.normpath(member.name) for member in tar.getmembers()}
        folders = {posixpath.dirname(name) for name in names}
        found = []
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith(".md"):
                continue
            handle = tar.extractfile(member)
            assert handle is not None
            for link in relative_links(handle.read().decode("utf-8")):
                path = link.split("#", 1)[0]
                target = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), path))
                if target not in names and target not in folders:
                    found.append(f"{member.name}: {link}")
        return found


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("collection")
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    subprocess.run(
        [str(galaxy), "collection", "build", "--output-path", str(out), str(ROOT)], check=True, capture_output=True
    )
    (tarball,) = out.glob("vllm_ops-dflash-*.tar.gz")
    return tarball


def test_every_relative_link_of_a_shipped_markdown_file_resolves_in_the_artifact(artifact):
    assert dead_links(artifact) == []


def test_the_link_check_finds_a_link_to_a_file_left_out(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md) [gone](docs/gpu-runs/x/README.md#top) [web](https://example.org/x) [here](#why)\n"
        "```\n[in a fence](nowhere.md)\n```\n[ref]: ../outside.md\n"
    )
    (tmp_path / "a.md").write_text("# a\n")
    tarball = tmp_path / "c.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(doc, arcname="README.md")
        tar.add(tmp_path / "a.md", arcname="docs/a.md")
    assert dead_links(tarball) == ["README.md: docs/gpu-runs/x/README.md#top", "README.md: ../outside.md"]


def test_the_licence_galaxy_yml_names_is_shipped_in_full(artifact):
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert galaxy["license"] == ["GPL-3.0-or-later"]
    with tarfile.open(artifact) as tar:
        handle = tar.extractfile("LICENSE")
        assert handle is not None
        text = handle.read().decode("utf-8")
    assert text.startswith(
        "                    GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007"
    )
    assert "END OF TERMS AND CONDITIONS" in text and "How to Apply These Terms to Your New Programs" in text


def test_galaxy_yml_names_no_made_up_url():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    urls = {key: galaxy.get(key) for key in ("repository", "documentation", "homepage", "issues") if galaxy.get(key)}
    assert not [url for url in urls.values() if ".invalid" in url or "example." in url], urls


@pytest.mark.parametrize("playbook", ["deploy_dflash.yml", "rollback.yml"])
def test_every_task_file_a_playbook_reads_ships(artifact, playbook):
    # The deploy's build and rollout are include_tasks, read only when a host reaches them: a task file left out
    # of the artifact would pass the syntax check and fail mid-deploy.
    with tarfile.open(artifact) as tar:
        shipped = {posixpath.normpath(member.name) for member in tar.getmembers() if member.isfile()}
    for path in files(playbook):
        assert str(path.relative_to(ROOT)) in shipped, path
