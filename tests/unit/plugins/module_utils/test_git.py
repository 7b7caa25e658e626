"""Ref resolution against real repositories, the bare mirror, and the build checkout."""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _git
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    changed_paths,
    checkout,
    commit_exists,
    ensure_mirror,
    fetch_ref,
    fetch_short_sha,
    git_env,
    merge_base,
    mirror_path,
    resolve_remote,
    resolve_short_sha,
    rev_parse,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import add_commit, git, make_tiny_repo

UNREACHABLE = "https://deploy:s3cr3t-token@127.0.0.1:9/vllm.git"  # port 9: connection refused at once


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("git") / "repo"
    shas = make_tiny_repo(path)
    git(path, "tag", "light", shas["c2"])  # a lightweight tag
    git(path, "tag", "-a", "clash", "-m", "tag named like a branch", shas["c1"])
    git(path, "branch", "clash", shas["c3"])
    return path, shas


@pytest.fixture(scope="module")
def mirror(tiny, tmp_path_factory):
    repo = tiny[0]
    path = mirror_path(str(tmp_path_factory.mktemp("root")), str(repo))
    ensure_mirror(str(repo), path, timeout=60, extra=["refs/pull/1/head"])
    return path


@pytest.mark.parametrize(
    ("ref", "label", "kind", "full_ref"),
    [
        ("main", "c3", "branch", "refs/heads/main"),
        ("v1.0.0", "c1", "tag", "refs/tags/v1.0.0"),  # annotated: the commit, not the tag object
        ("light", "c2", "tag", "refs/tags/light"),
        ("refs/pull/1/head", "p1", "ref", "refs/pull/1/head"),
        ("refs/tags/v1.0.0", "c1", "ref", "refs/tags/v1.0.0"),
        ("refs/heads/clash", "c3", "ref", "refs/heads/clash"),
        ("HEAD", "c3", "head", "HEAD"),
    ],
)
def test_names_resolve_with_ls_remote(tiny, ref, label, kind, full_ref):
    repo, shas = tiny
    resolution = resolve_remote(str(repo), ref)
    assert (resolution.commit, resolution.kind, resolution.full_ref) == (shas[label], kind, full_ref)


def test_full_sha_is_taken_as_is_after_reaching_the_repo(tiny):
    repo, shas = tiny
    assert resolve_remote(str(repo), shas["p1"].upper()).commit == shas["p1"]
    with pytest.raises(GitError, match="cannot reach repository"):
        resolve_remote(str(repo) + "-missing", shas["p1"])


def test_short_sha_needs_the_mirror(tiny):
    repo, shas = tiny
    resolution = resolve_remote(str(repo), shas["c2"][:8])
    assert (resolution.commit, resolution.kind) == (None, "short_sha")


@pytest.mark.parametrize("ref", ["no-such-branch", "refs/pull/99/head", "refs/tags/nope"])
def test_unknown_ref(tiny, ref):
    repo = tiny[0]
    with pytest.raises(GitError, match=r"not found|does not exist") as info:
        resolve_remote(str(repo), ref)
    assert repr(ref) in str(info.value) and str(repo) in str(info.value)


def test_branch_and_tag_of_the_same_name_are_refused(tiny):
    repo = tiny[0]
    with pytest.raises(GitError, match=r"both a branch .* and a tag .*refs/heads/clash or ref: refs/tags/clash"):
        resolve_remote(str(repo), "clash")


@pytest.mark.parametrize("ref", ["", "-uupload-pack=touch /tmp/x", "a..b", "main~1", "x y"])
def test_invalid_refs_are_refused(tiny, ref):
    repo = tiny[0]
    with pytest.raises(GitError, match="not a valid git ref"):
        resolve_remote(str(repo), ref)


def test_option_like_repo_is_refused():
    with pytest.raises(GitError, match="not a repository URL or path"):
        resolve_remote("--upload-pack=touch /tmp/pwned", "main")


def test_unreachable_repo_names_the_url_without_credentials():
    with pytest.raises(GitError) as info:
        resolve_remote(UNREACHABLE, "main", timeout=30)
    message = str(info.value)
    assert "cannot reach repository https://127.0.0.1:9/vllm.git" in message
    assert "s3cr3t" not in message and "deploy" not in message


def test_git_env_never_prompts():
    env = git_env({"PATH": "/bin"})
    assert env["LC_ALL"] == "C" and env["GIT_TERMINAL_PROMPT"] == "0"
    assert "BatchMode=yes" in env["GIT_SSH_COMMAND"]
    assert git_env({"GIT_SSH_COMMAND": "ssh -i key"})["GIT_SSH_COMMAND"] == "ssh -i key"


def test_mirror_path_is_stable_and_secret_free(tmp_path):
    with_token = mirror_path("/opt/vllm", "https://u:tok@github.com/vllm-project/vllm.git")
    plain = mirror_path("/opt/vllm", "https://github.com/vllm-project/vllm")
    assert with_token == plain
    assert os.path.basename(plain).startswith("vllm-project-vllm-") and plain.endswith(".git")
    assert os.path.dirname(plain) == "/opt/vllm/src"
    assert mirror_path("/opt/vllm", "https://github.com/other/vllm.git") != plain


def test_mirror_is_bare_full_and_has_the_pull_ref(tiny, mirror):
    repo, shas = tiny
    assert git(Path(mirror), "rev-parse", "--is-bare-repository") == "true"
    assert git(Path(mirror), "rev-parse", "refs/pull/1/head") == shas["p1"]
    assert git(Path(mirror), "rev-parse", "v1.0.0^{commit}") == shas["c1"]
    assert git(Path(mirror), "rev-parse", "--is-shallow-repository") == "false"
    assert str(repo) not in Path(mirror, "config").read_text()  # the URL (and any token) is not stored


def test_short_sha_resolves_in_the_mirror(tiny, mirror):
    repo, shas = tiny
    assert resolve_short_sha(mirror, shas["c2"][:7].upper(), str(repo)) == shas["c2"]
    assert resolve_short_sha(mirror, "0000000", str(repo)) is None


def test_short_sha_reads_without_a_mirror_and_fetches_on_demand(tiny, tmp_path):
    repo, shas = tiny
    path = mirror_path(str(tmp_path), str(repo))
    assert resolve_short_sha(path, shas["c2"][:9], str(repo)) is None
    assert not os.path.exists(path)  # reading (check mode) creates nothing
    assert fetch_short_sha(str(repo), path, shas["c2"][:9], 60) == shas["c2"]
    with pytest.raises(GitError, match="no branch, tag or commit starting with it"):
        fetch_short_sha(str(repo), path, "abcdef0", 60)


def test_ambiguous_short_sha_is_refused(tmp_path):
    repo = tmp_path / "many"
    git(tmp_path, "init", "-q", str(repo))
    stream = "".join(
        f"commit refs/heads/many\ncommitter t <t@x> 1700000000 +0000\ndata {len(str(i))}\n{i}\n\n" for i in range(1500)
    )
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=stream, text=True, check=True, env=git_env())
    by_prefix = defaultdict(list)
    for sha in git(repo, "rev-list", "many").split():
        by_prefix[sha[:4]].append(sha)
    prefix, clash = next((p, s) for p, s in by_prefix.items() if len(s) > 1)
    path = mirror_path(str(tmp_path), str(repo))
    ensure_mirror(str(repo), path, 60)
    with pytest.raises(GitError, match=f"short SHA '{prefix}' is ambiguous.*{clash[0][:12]}|{clash[1][:12]}"):
        resolve_short_sha(path, prefix, str(repo))


def test_fetch_by_sha_of_a_commit_on_no_ref(tiny, tmp_path):
    repo, shas = tiny
    orphan = git(repo, "commit-tree", "-p", shas["c1"], "-m", "on no ref", git(repo, "rev-parse", "main^{tree}"))
    path = mirror_path(str(tmp_path), str(repo))
    ensure_mirror(str(repo), path, 60)
    assert not commit_exists(path, orphan)
    ensure_mirror(str(repo), path, 60, extra=[orphan])
    assert commit_exists(path, orphan)


@pytest.mark.parametrize("label", ["c3", "p1"])
def test_checkout_has_full_history_and_tags(tiny, mirror, tmp_path, label):
    shas = tiny[1]
    dest = tmp_path / "build" / "src"
    checkout(mirror, shas[label], str(dest), 60)
    assert git(dest, "rev-parse", "HEAD") == shas[label]
    assert git(dest, "status", "--porcelain") == ""
    assert git(dest, "rev-parse", "--is-shallow-repository") == "false"
    # What setuptools-scm runs: needs the tag and the full history to count commits since it.
    assert git(dest, "describe", "--tags", "--long", "--match", "v[0-9]*").startswith("v1.0.0-2-g")


def test_checkout_of_unknown_commit_fails_clearly(mirror, tmp_path):
    with pytest.raises(GitError, match="git checkout failed"):
        checkout(mirror, "0" * 40, str(tmp_path / "src"), 60)


def test_a_branch_bump_is_a_fetch_into_the_same_mirror(tmp_path):
    repo = tmp_path / "repo"
    make_tiny_repo(repo)
    path = mirror_path(str(tmp_path / "root"), str(repo))
    log = tmp_path / "fetch.log"
    ensure_mirror(str(repo), path, 60, str(log))
    Path(path, "vllm-ops-test-marker").write_text("first mirror")
    inode = os.stat(path).st_ino
    bumped = add_commit(repo, "main", "bumped")
    git(repo, "tag", "-a", "v1.1.0", "-m", "tag after the bump", bumped)
    ensure_mirror(str(repo), path, 60, str(log))
    assert Path(path, "vllm-ops-test-marker").read_text() == "first mirror" and os.stat(path).st_ino == inode
    assert git(Path(path), "rev-parse", "refs/heads/main") == bumped
    assert git(Path(path), "rev-parse", "v1.1.0^{commit}") == bumped  # tags too: setuptools-scm needs them
    assert git(Path(path), "rev-parse", "--is-shallow-repository") == "false"
    commands = [line.split("$ ", 1)[1] for line in log.read_text().splitlines() if "$ git" in line]
    assert len(commands) == 2 and all(command.startswith(f"git --git-dir {path} fetch ") for command in commands)
    assert all("--depth" not in command for command in commands)


def test_merge_base_diff_and_a_separate_upstream(tiny, mirror, tmp_path):
    repo, shas = tiny
    assert merge_base(mirror, shas["p1"], shas["c3"]) == shas["c2"]
    assert changed_paths(mirror, shas["c2"], shas["p1"]) == ["tinypkg/__init__.py"]
    assert rev_parse(mirror, "main") == shas["c3"] and rev_parse(mirror, "v1.0.0") == shas["c1"]
    assert rev_parse(mirror, "refs/pull/1/head") == shas["p1"] and rev_parse(mirror, "nope") is None
    # An upstream fetched into its own ref of another mirror: history shared, merge-base found.
    other = mirror_path(str(tmp_path), "/elsewhere/fork.git")
    ensure_mirror(str(repo), other, 60)
    orphan_tree = git(repo, "rev-parse", "main^{tree}")
    orphan = git(repo, "commit-tree", "-m", "unrelated", orphan_tree)
    git(repo, "update-ref", "refs/heads/unrelated-up", orphan)
    fetch_ref(str(repo), other, "refs/heads/unrelated-up", "refs/vllm-ops/precompiled-base/x", 60)
    assert rev_parse(other, "refs/vllm-ops/precompiled-base/x") == orphan
    assert merge_base(other, orphan, shas["c3"]) is None
    git(repo, "update-ref", "-d", "refs/heads/unrelated-up")


@pytest.mark.parametrize(
    "allowing_env",
    [
        {"GIT_ALLOW_PROTOCOL": "ext:file"},
        {"GIT_CONFIG_PARAMETERS": "'protocol.ext.allow'='always'"},
        {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.allow", "GIT_CONFIG_VALUE_0": "always"},
    ],
    ids=["GIT_ALLOW_PROTOCOL", "config-parameters", "config-count"],
)
def test_ext_transport_is_never_executed_even_where_the_environment_allows_it(tmp_path, monkeypatch, allowing_env):
    marker = tmp_path / "pwned"
    for name, value in allowing_env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(GitError) as info:
        resolve_remote(f"ext::sh -c touch% {marker}", "main", timeout=30)
    assert not marker.exists()
    assert "transport 'ext' not allowed" in str(info.value)


def test_git_env_allows_only_the_plain_transports():
    assert git_env({"GIT_ALLOW_PROTOCOL": "ext"})["GIT_ALLOW_PROTOCOL"] == "file:git:http:https:ssh"


def test_credentials_in_the_repo_url_never_reach_gits_argv(monkeypatch):
    """Issue 28's principle (secrets never on argv), where it reaches git: the repo URL's token was on the
    argv of git ls-remote / fetch, readable by every local user in `ps`. Now git gets it from a helper."""
    seen = []
    real_run = _git.run

    def spy(argv, timeout, **kwargs):
        seen.append((list(argv), dict(kwargs["env"])))
        return real_run(argv, timeout, **kwargs)

    monkeypatch.setattr(_git, "run", spy)
    with pytest.raises(GitError):
        resolve_remote(UNREACHABLE, "main", timeout=30)
    assert seen
    for argv, _env in seen:
        assert not any("s3cr3t" in arg for arg in argv), argv
        assert "https://127.0.0.1:9/vllm.git" in argv
    # git itself answers with the credentials, from the environment the call had
    filled = subprocess.run(
        ["git", "credential", "fill"], input="protocol=https\nhost=127.0.0.1:9\n\n", env=seen[0][1],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert "username=deploy" in filled.stdout and "password=s3cr3t" in filled.stdout
    other = subprocess.run(
        ["git", "credential", "fill"], input="protocol=https\nhost=other.example\n\n", env=seen[0][1],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert "s3cr3t" not in other.stdout  # scoped to the repo's host: another host never gets them


def test_git_authenticates_with_the_repo_urls_credentials_from_the_helper():
    """The other half: a server that asks for credentials (401) gets the URL's, from the helper."""
    import base64
    import http.server
    import threading

    headers = []

    class Smart(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            headers.append(self.headers.get("Authorization"))
            self.send_response(404 if self.headers.get("Authorization") else 401)
            if not self.headers.get("Authorization"):
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Smart)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(GitError) as info:
            resolve_remote(f"http://deploy:s3cr3t-token@127.0.0.1:{server.server_address[1]}/vllm.git", "main", 60)
    finally:
        server.shutdown()
    assert "s3cr3t" not in str(info.value)
    assert "Basic " + base64.b64encode(b"deploy:s3cr3t-token").decode() in headers
