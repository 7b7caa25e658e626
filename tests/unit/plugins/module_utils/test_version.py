# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._version import (
    VersionError,
    commit_matches,
    parse_version,
    same_commit,
)
from packaging.version import Version

FULL_HASH = "0123456789abcdef0123456789abcdef01234567"
# text -> setuptools-scm parts (commit_prefix, dirty_date, platform); the PEP 440 parts are checked
# against `packaging` below.
SCM_CASES = [
    ("0.1.dev16016+g3cfc8f8b7", "3cfc8f8b7", None, None),
    ("0.26.0", None, None, None),
    ("0.29.1rc1.dev263+gb0b2f27da.d20260917", "b0b2f27da", "20260917", None),
    ("0.29.1rc1.dev263+gb0b2f27da.d20260917.cu130", "b0b2f27da", "20260917", "cu130"),
    ("0.26.0+cu130", None, None, "cu130"),
    (f"0.11.1.dev5+g{FULL_HASH}.cu129", FULL_HASH, None, "cu129"),
    ("0.10.0+rocm6.3", None, None, "rocm6.3"),
    ("0.9.2.dev1+d20250101", None, "20250101", None),
    ("0.9.2+gfx942", None, None, "gfx942"),  # `g` + non-hex is a platform, not a commit
    ("0.9.2+g123abc", None, None, "g123abc"),  # too short for a git abbreviation
    ("1!2.0.post3.dev4+G3CFC8F8B7-Cu130", "3cfc8f8b7", None, "cu130"),
    ("v0.8.5-rc.2", None, None, None),
    ("0.8.5alpha1", None, None, None),
    ("0.8.5c1", None, None, None),
    ("0.8.5-1", None, None, None),
    ("0.8.5.rev", None, None, None),
    ("0.8.5.dev", None, None, None),
    ("  0.8.5  ", None, None, None),
    ("1.0-beta-", None, None, None),
    ("1.0rc.1.dev.", None, None, None),
]


def _pre(version: Version):
    return None if version.pre is None else (version.pre[0], version.pre[1])


@pytest.mark.parametrize(("text", "commit_prefix", "dirty_date", "platform"), SCM_CASES)
def test_parse_matches_packaging(text, commit_prefix, dirty_date, platform):
    parsed = parse_version(text)
    reference = Version(text)
    assert str(parsed) == str(reference)
    assert parsed.public == reference.public
    assert parsed.epoch == reference.epoch
    assert parsed.release == reference.release
    assert parsed.pre == _pre(reference)
    assert parsed.post == reference.post
    assert parsed.dev == reference.dev
    assert parsed.local == reference.local
    assert parsed.text == text
    assert (parsed.commit_prefix, parsed.dirty_date, parsed.platform) == (commit_prefix, dirty_date, platform)


def test_as_dict_is_json_friendly():
    info = parse_version("0.29.1rc1.dev263+gb0b2f27da.d20260917").as_dict()
    assert info == {
        "public": "0.29.1rc1.dev263",
        "epoch": 0,
        "release": [0, 29, 1],
        "pre": "rc1",
        "post": None,
        "dev": 263,
        "local": "gb0b2f27da.d20260917",
        "commit_prefix": "b0b2f27da",
        "dirty_date": "20260917",
        "platform": None,
    }


@pytest.mark.parametrize("text", ["", "latest", "0.1.dev+", "1.0+", "1.0+abc..def", "0.26.0.cu130", "1.0-"])
def test_invalid_versions_are_rejected_like_packaging(text):
    with pytest.raises(VersionError, match="not a PEP 440 version"):
        parse_version(text)
    with pytest.raises(ValueError):
        Version(text)


def test_non_string_is_rejected():
    with pytest.raises(VersionError, match="must be a string"):
        parse_version(None)  # type: ignore[arg-type]


SHA = "3cfc8f8b7a1b2c3d4e5f60718293a4b5c6d7e8f9"


@pytest.mark.parametrize(
    ("version", "commit", "expected"),
    [
        ("0.1.dev16016+g3cfc8f8b7", SHA, True),
        ("0.1.dev16016+g3cfc8f8b7", SHA.upper(), True),
        ("0.1.dev16016+g3cfc8f8b7", "3cfc8f8", True),  # abbreviated commit: compared on the common length
        ("0.1.dev16016+g3cfc8f8b7", "b0b2f27da" + SHA[9:], False),
        ("0.1.dev16016+g3cfc8f8b7", "3cfc8f8b8" + SHA[9:], False),
        ("0.26.0", SHA, None),
        ("0.26.0+cu130", SHA, None),
    ],
)
def test_commit_matches(version, commit, expected):
    assert commit_matches(version, commit) is expected
    assert commit_matches(parse_version(version), commit) is expected


@pytest.mark.parametrize("commit", ["", "xyz1234567", "3cfc8f", None])
def test_commit_matches_rejects_bad_commit(commit):
    with pytest.raises(VersionError, match="at least 7 hex"):
        commit_matches("0.1.dev1+g3cfc8f8b7", commit)


def test_same_commit():
    assert same_commit("ffd46bfab", "FFD46BFAB" + "0" * 31) is True
    assert same_commit(SHA, SHA[:7]) is True
    assert same_commit("ffd46bfab", SHA) is False
    with pytest.raises(VersionError, match="at least 7 hex"):
        same_commit("ffd46", SHA)


def test_the_parse_needs_no_installed_packaging():
    """The host's python may lack packaging: the vendored copy (_vendor/packaging) parses versions and wheel
    names and lists tags, nothing else."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    collections = Path(__file__).resolve().parents[4] / ".cache" / "ac"
    script = (
        "import sys\n"
        "from ansible_collections.vllm_ops.dflash.plugins.module_utils._version import parse_version\n"
        "from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_compat import (\n"
        "    parse_wheel_filename, python_fits)\n"
        "v = parse_version('1!0.29.1rc1.dev263+gb0b2f27da.d20260917.cu130')\n"
        "tags = parse_wheel_filename('vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl')[3]\n"
        "assert 'packaging' not in sys.modules, 'an installed packaging was imported'\n"
        "print(v.public, v.local, v.commit_prefix, python_fits(tags, '3.12.1'))\n"
    )
    # -S: no site-packages, so an installed packaging cannot be found; only the collection is on the path.
    env = dict(os.environ, PYTHONPATH=str(collections))
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1!0.29.1rc1.dev263", "gb0b2f27da.d20260917.cu130", "b0b2f27da", "True"]
