"""Bad input and hostile conditions (issue 14): what serves is never removed, secrets are never recorded,
debris goes, and every refusal names the cause and the fix."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build_paths, _builder
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildError, BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import host_lock
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import installed_version, make_tiny_repo

SLOW = pytest.mark.slow_build
STAGING = _build_paths.STAGING_PREFIX


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("hardening-repo") / "repo"
    return path, make_tiny_repo(path)


@pytest.fixture(scope="module")
def built(tiny, pip_args, tmp_path_factory):
    """One full build of main: its wheel lets the other tests make releases by installing it (fast)."""
    root = tmp_path_factory.mktemp("hardening-build") / "root"
    return build(BuildOptions(str(tiny[0]), "main", root=str(root), python=sys.executable, pip_args=pip_args))


def _options(tiny, root: Path, pip_args, **kwargs) -> BuildOptions:
    return BuildOptions(str(tiny[0]), "main", root=str(root), python=sys.executable, pip_args=pip_args, **kwargs)


def _serve(root: Path, name: str) -> None:
    os.symlink(f"releases/{name}", root / "current")


@SLOW
@pytest.mark.parametrize("damage", ["missing", "corrupt", "not-an-object"])
def test_the_release_current_names_is_built_beside_and_swapped_never_removed(tiny, pip_args, built, tmp_path, damage):
    root = tmp_path / "root"
    opts = _options(tiny, root, pip_args, wheel=built["wheel"], precompiled="never")
    first = build(opts)
    _serve(root, first["release_name"])
    manifest = Path(first["release"], "manifest.json")
    if damage == "missing":
        manifest.unlink()
    else:
        manifest.write_text("{not json" if damage == "corrupt" else "[1, 2]")
    serving_python = root / "current" / "venv" / "bin" / "python"
    marker = Path(first["release"], "venv", "served-before")
    marker.write_text("the venv that serves")

    predicted = build(opts, check_mode=True)
    assert predicted["changed"] is True and "beside the incomplete release `current` names" in predicted["msg"]

    gone = []
    stop = threading.Event()

    def watch() -> None:  # what a restart of the service would find, all along the rebuild
        while not stop.wait(0.05):
            if not serving_python.exists():
                gone.append("current/venv/bin/python")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        again = build(opts)
    finally:
        stop.set()
        watcher.join()
    assert gone == []  # before: the serving venv vanished for the length of the rebuild
    assert (again["changed"], again["release_name"]) == (True, first["release_name"])
    assert json.loads(manifest.read_text())["name"] == first["release_name"]
    assert not marker.exists()  # the new venv took its place
    venv = Path(first["release"], "venv")
    assert installed_version(str(root / "current" / "venv")) == json.loads(manifest.read_text())["version"]
    # the swapped-in venv's scripts name its final place, not where it was built
    pip_script = (venv / "bin" / "pip").read_text()
    assert str(venv) in pip_script and _build_paths.STAGING_PREFIX not in pip_script
    assert not [name for name in os.listdir(root / "releases") if name.startswith(".")]
    assert build(opts)["changed"] is False


@SLOW
def test_a_failed_rebuild_of_the_serving_release_leaves_it_as_it_was(tiny, pip_args, built, tmp_path, monkeypatch):
    root = tmp_path / "root"
    opts = _options(tiny, root, pip_args, wheel=built["wheel"], precompiled="never")
    first = build(opts)
    _serve(root, first["release_name"])
    Path(first["release"], "manifest.json").unlink()
    before = sorted(str(p.relative_to(root)) for p in (root / "releases").rglob("*"))

    def broken_install(self, wheel, wheel_sha):
        raise BuildError("installing the wheel failed with exit code 1")

    monkeypatch.setattr(_builder.Builder, "install", broken_install)
    with pytest.raises(BuildError, match="installing the wheel failed") as info:
        build(opts)
    assert "remove" not in str(info.value).split("Full log:", maxsplit=1)[0]
    assert sorted(str(p.relative_to(root)) for p in (root / "releases").rglob("*")) == before
    assert (root / "current" / "venv" / "bin" / "python").exists()


@SLOW
def test_secrets_in_pip_args_build_env_and_the_wheel_url_are_recorded_nowhere(tiny, pip_args, built, tmp_path):
    root = tmp_path / "root"
    secrets = ["s3cr3t-index-token", "hf_s3cr3t_value"]
    args = [*pip_args, "--extra-index-url", f"https://__token__:{secrets[0]}@127.0.0.1:9/simple"]
    env = {"HF_TOKEN": secrets[1], "WANDB_APIKEY": secrets[1], "MAX_JOBS": "1"}
    opts = _options(tiny, root, args, wheel=built["wheel"], build_env=env, precompiled="never")
    result = build(opts)
    texts = {"result": json.dumps(result)}
    texts["manifest"] = Path(result["release"], "manifest.json").read_text()
    texts["log"] = Path(result["log_path"]).read_text()
    texts["status"] = (root / "build-status.json").read_text()
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, (where, secret)
    manifest = json.loads(texts["manifest"])
    assert manifest["inputs"]["build_env"] == {"HF_TOKEN": "********", "WANDB_APIKEY": "********", "MAX_JOBS": "1"}
    assert "https://127.0.0.1:9/simple" in manifest["inputs"]["pip_args"]


@SLOW
def test_a_github_pat_is_in_no_file_and_the_manifest_and_log_are_private(tiny, pip_args, built, tmp_path):
    """Issue 28, case 10: GITHUB_PAT was in clear in manifest.json and the build log, both 0644."""
    root = tmp_path / "root"
    env = {"GITHUB_PAT": "ghp_s3cr3tPAT0123", "MAX_JOBS": "1"}
    result = build(_options(tiny, root, pip_args, wheel=built["wheel"], build_env=env, precompiled="never"))
    manifest, log = Path(result["release"], "manifest.json"), Path(result["log_path"])
    for path in (manifest, log, root / "build-status.json"):
        assert "ghp_s3cr3tPAT0123" not in path.read_text(), path
    assert "ghp_s3cr3tPAT0123" not in json.dumps(result)
    assert json.loads(manifest.read_text())["inputs"]["build_env"]["GITHUB_PAT"] == "********"
    assert {path.name: os.stat(path).st_mode & 0o777 for path in (manifest, log)} == {
        "manifest.json": 0o600,
        log.name: 0o600,
    }


@SLOW
@pytest.mark.parametrize("linked", ["build", "releases", "wheels", "src"])
def test_a_linked_build_dir_is_refused_and_nothing_outside_the_root_is_deleted(tiny, pip_args, built, tmp_path, linked):
    """Issue 28, case 1: with <root>/build a symlink to a scratch disk, every build rmtree'd every entry of
    the link's target. Now the build refuses before it deletes (or writes) anything there."""
    root, scratch = tmp_path / "root", tmp_path / "scratch"
    (scratch / "someone-elses-dir").mkdir(parents=True)
    (scratch / "someone-elses-dir" / "data").write_text("keep me")
    (scratch / f"{STAGING}0123456789ab-01234567").mkdir()  # looks like our debris, but is not in the root
    root.mkdir()
    os.symlink(scratch, root / linked)
    opts = _options(tiny, root, pip_args, wheel=built["wheel"], precompiled="never")
    with pytest.raises(BuildError, match=f"{linked} leads out of") as info:
        build(opts)
    assert "Fix:" in str(info.value) and "Nothing was changed" in str(info.value)
    assert sorted(p.name for p in scratch.iterdir()) == [f"{STAGING}0123456789ab-01234567", "someone-elses-dir"]
    assert (scratch / "someone-elses-dir" / "data").read_text() == "keep me"


@SLOW
def test_credentials_in_pip_args_never_reach_an_argv(tiny, pip_args, built, tmp_path, monkeypatch):
    """Issue 28, case 9: credentials in pip_args were on the build's argv, readable by every local user in
    `ps`. Now the URLs go without them and pip/uv get them from a 0600 netrc file."""
    root = tmp_path / "root"
    args = [*pip_args, "--extra-index-url", "https://__token__:s3cr3t-argv-token@127.0.0.1:9/simple"]
    seen = []
    real_run = _builder.run_command

    def spy(argv, timeout, **kwargs):
        netrc = kwargs["env"].get("NETRC")
        given = (Path(netrc).read_text(), os.stat(netrc).st_mode & 0o777) if netrc and os.path.exists(netrc) else None
        seen.append((list(argv), given))
        return real_run(argv, timeout, **kwargs)

    monkeypatch.setattr(_builder, "run_command", spy)
    build(_options(tiny, root, args, wheel=built["wheel"], precompiled="never"))
    installs = [(argv, given) for argv, given in seen if "install" in argv]
    assert installs, seen
    for argv, _given in seen:
        assert not any("s3cr3t-argv-token" in arg for arg in argv), argv
    for argv, given in installs:
        assert "https://127.0.0.1:9/simple" in argv
        assert given == ("machine 127.0.0.1 login __token__ password s3cr3t-argv-token\n", 0o600)
    assert not (root / "build").exists() or not any((root / "build").iterdir())  # the netrc went with the build dir


def test_a_ref_with_a_newline_or_nul_is_refused_before_anything_is_written(tiny, tmp_path):
    for ref in ("main\n", "ma\x00in"):
        with pytest.raises(BuildError, match="contains a control character") as info:
            build(BuildOptions(str(tiny[0]), ref, root=str(tmp_path / "root"), python=sys.executable))
        assert "Fix:" in str(info.value)
    assert not (tmp_path / "root").exists()


@pytest.mark.slow
def test_a_held_lock_names_the_option_vllm_build_has(tiny, tmp_path):
    root = tmp_path / "root"
    opts = BuildOptions(str(tiny[0]), "main", root=str(root), python=sys.executable, build_timeout=5)
    with host_lock(str(root)), pytest.raises(BuildError) as info:
        build(opts)
    message = str(info.value)
    assert f"process {os.getpid()}" in message and "raise build_timeout" in message
    assert "lock timeout" not in message  # before: an option vllm_build does not have


def test_a_full_disk_says_no_space_left_on_device(tiny, pip_args, tmp_path):
    """The venv step of a full disk (python -m venv fails with ENOSPC): the message names the cause."""
    fake = tmp_path / "python-on-a-full-disk"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ]; then echo "OSError: [Errno 28] No space left on device: \'$3\'" >&2; exit 1; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    root = tmp_path / "root"
    opts = BuildOptions(str(tiny[0]), "main", root=str(root), python=str(fake), pip_args=pip_args)
    with pytest.raises(BuildError) as info:
        build(opts)
    message = str(info.value)
    assert "creating the venv failed with exit code 1; no space left on device" in message
    assert "Fix: free space there" in message


@SLOW
def test_debris_of_killed_builds_goes_at_the_next_build(tiny, pip_args, built, tmp_path):
    root = tmp_path / "root"
    killed = root / "build" / "0123456789ab-deadbeef" / "tmp" / "pip-build-env-x1y2"
    killed.mkdir(parents=True)
    (killed / "torch.so").write_text("gigabytes")
    staged = root / "releases" / f"{_build_paths.STAGING_PREFIX}0123456789ab-deadbeef"
    staged.mkdir(parents=True)
    # killed between the two renames of a swap: the old one moved away, the complete new one not yet in place
    swapped = root / "releases" / f"{_build_paths.STAGING_PREFIX}fedcba987654-deadbeef"
    swapped.mkdir(parents=True)
    (swapped / "manifest.json").write_text("{}")
    build(_options(tiny, root, pip_args, wheel=built["wheel"], precompiled="never"))
    assert os.listdir(root / "build") == []
    assert not staged.exists()
    assert (root / "releases" / "fedcba987654-deadbeef" / "manifest.json").is_file()
    shutil.rmtree(root)


def _wheel_needing_pyyaml(directory: Path) -> Path:
    """A pure-Python wheel of tinypkg that depends on PyYAML (in the test wheelhouse), as vLLM on torch."""
    import base64
    import hashlib
    import zipfile

    version = "9.9.9"
    files = {
        "tinypkg/__init__.py": "STEP = 'from a wheel'\n",
        f"tinypkg-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\nRequires-Dist: PyYAML\n"
        ),
        f"tinypkg-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"tinypkg-{version}.dist-info/RECORD"] = "\n".join([*record, f"tinypkg-{version}.dist-info/RECORD,,"]) + "\n"
    path = directory / f"tinypkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@SLOW
def test_uv_releases_share_one_copy_of_each_package(tiny, pip_args, tmp_path, monkeypatch):
    """uv installs by hardlink from <root>/cache/uv: three releases hold one copy of a dependency's files
    (for vLLM: torch and the CUDA libraries, most of a release's 7.9 GB)."""
    from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import uv_bin_dir

    uv_dir = uv_bin_dir()
    if uv_dir is None:
        pytest.skip("could not pip-install uv from PyPI into .cache/uv")
    monkeypatch.setenv("PATH", f"{uv_dir}{os.pathsep}{os.environ['PATH']}")
    wheel = _wheel_needing_pyyaml(tmp_path)
    root = tmp_path / "root"
    inodes = set()
    for mark in ("1", "2", "3"):  # three build inputs: three releases
        opts = _options(tiny, root, pip_args, wheel=str(wheel), precompiled="never", build_env={"MARK": mark})
        result = build(opts)
        manifest = json.loads(Path(result["release"], "manifest.json").read_text())
        assert manifest["inputs"]["installer"] == "uv"
        assert manifest["added_env"]["UV_LINK_MODE"] == "hardlink"
        assert manifest["added_env"]["UV_CACHE_DIR"] == str(root / "cache" / "uv")
        (module,) = Path(result["release"], "venv").glob("lib/python*/site-packages/yaml/__init__.py")
        inodes.add(module.stat().st_ino)
    assert len(os.listdir(root / "releases")) == 3 and len(inodes) == 1
