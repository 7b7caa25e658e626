"""Shared helpers: atomic JSON, timestamps, hashes, URL redaction."""

from __future__ import annotations

import hashlib
import os
import re

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    open_private_append,
    read_json,
    redact_url,
    remove_tree_within,
    secret_name,
    sha256_file,
    sha256_stream,
    utc_now,
    write_json_atomic,
)


def test_write_then_read_round_trip(tmp_path):
    path = str(tmp_path / "sub" / "state.json")
    write_json_atomic(path, {"b": [1, 2], "a": None})
    assert read_json(path) == {"a": None, "b": [1, 2]}
    write_json_atomic(path, {"a": 2})
    assert read_json(path) == {"a": 2}
    assert os.listdir(tmp_path / "sub") == ["state.json"]  # no temp file left


def test_failed_write_keeps_old_file(tmp_path):
    path = str(tmp_path / "state.json")
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert read_json(path) == {"a": 1}
    assert os.listdir(tmp_path) == ["state.json"]


def test_read_json_default_and_corrupt(tmp_path):
    assert read_json(str(tmp_path / "missing.json"), {"x": 1}) == {"x": 1}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json is not valid JSON"):
        read_json(str(bad), {})


def test_utc_now_format():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", utc_now())


def test_sha256_file(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 5)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


def test_sha256_stream_copies_and_feeds_other_hashes_in_the_one_read():
    import io

    data = os.urandom(3 * (1 << 20) + 5)  # more than one chunk, and not a whole number of them
    copy, sha1 = io.BytesIO(), hashlib.sha1(b"blob %d\0" % len(data))
    digest = sha256_stream(io.BytesIO(data), copy_to=copy, also=[sha1])
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert copy.getvalue() == data
    assert sha1.hexdigest() == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:ghp_secret@github.com/o/r.git", "https://github.com/o/r.git"),
        ("https://ghp_token@github.com/o/r.git", "https://github.com/o/r.git"),
        ("ssh://git@host:2222/o/r.git", "ssh://git@host:2222/o/r.git"),
        ("ssh://git:pw@host/o/r.git", "ssh://host/o/r.git"),
        ("https://github.com/o/r.git", "https://github.com/o/r.git"),
        ("git@github.com:o/r.git", "git@github.com:o/r.git"),
        ("/srv/git/vllm", "/srv/git/vllm"),
        ("file:///srv/git/vllm", "file:///srv/git/vllm"),
        ("https://host/path@v1", "https://host/path@v1"),
        (
            "fatal: unable to access 'https://x:tok@h/r.git/': 403; see https://u@h2/a",
            "fatal: unable to access 'https://h/r.git/': 403; see https://h2/a",
        ),
    ],
)
def test_redact_url(url, expected):
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "name",
    ["HFTOKEN", "HF_TOKEN", "OPENAI_APIKEY", "DB_PASS", "GITHUB_PAT", "api_key", "password", "hf-token", "DB_PWD",
     "MY_CREDENTIALS", "AWS_SECRET_ACCESS_KEY", "gh_pat_2"],
)  # fmt: skip
def test_secret_names_are_found_by_substring(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "PATH", "PYTHONPATH", "PWD", "OLDPWD", "MAX_JOBS", "HOME"])
def test_names_that_only_look_like_a_marker_are_no_secret(name):
    assert not secret_name(name)


def test_a_private_log_is_0600_from_its_creation_and_made_so_if_wider(tmp_path):
    umask = os.umask(0o022)
    fresh, wide = tmp_path / "logs" / "fresh.log", tmp_path / "wide.log"
    wide.write_text("old\n")
    wide.chmod(0o644)
    for path in (fresh, wide):
        with open_private_append(str(path)) as handle:
            handle.write(b"line\n")
        assert os.stat(path).st_mode & 0o777 == 0o600, path
    os.umask(umask)
    assert wide.read_text() == "old\nline\n"


def test_write_json_atomic_gives_the_mode_asked_for(tmp_path):
    write_json_atomic(str(tmp_path / "m.json"), {"a": 1}, mode=0o600)
    assert os.stat(tmp_path / "m.json").st_mode & 0o777 == 0o600


def test_remove_tree_within_never_follows_a_link_out_of_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "f").write_text("x")
    (root / "own" / "sub").mkdir(parents=True)
    os.symlink(outside, root / "linked-dir")  # a parent that leads out
    os.symlink(outside / "victim", root / "own" / "link")  # a link to delete: the link, not its target
    assert remove_tree_within(str(root), str(root / "linked-dir" / "victim")) is False
    assert remove_tree_within(str(root), str(root / "own" / "link")) is True
    assert (outside / "victim" / "f").read_text() == "x" and not os.path.lexists(root / "own" / "link")
    assert remove_tree_within(str(root), str(root / "own")) is True and not (root / "own").exists()
