"""The real-vLLM lane (`make real-vllm`): vllm_build's decision and build on real vLLM source, not the fixture.

From scratch on any machine that reaches PyPI (about 4 GB downloaded; not part of `make test`):
  1. the vLLM sdist and its release wheel from PyPI by name (sources.py), uv into <dir>/tools when absent;
  2. a fork repo made from the sdist: `v<version>` on `main`, one branch per compiled path (sources.FORKS);
  3. vllm_build's core in check mode on each branch, as a user would call it (precompiled: auto, the
     release wheel as precompiled_wheel): decided vs the right answer, and the reason;
  4. a real build of the python-only branch on the precompiled path with uv, then vllm_facts' core on it;
  5. the figures, as markdown, to docs/real-vllm/<UTC date>.md (and JSON to <dir>/lane-result.json).
Exit status 1 when a decision is wrong or the build or facts fail. Everything heavy lives in <dir>
(--dir, default $REAL_VLLM_DIR or .cache/real-vllm), never in the checkout.
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime
import glob
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / ".cache" / "ac"))
_LINK = ROOT / ".cache" / "ac" / "ansible_collections" / "vllm_ops" / "dflash"
if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(ROOT, _LINK)

import sources  # noqa: E402

VERSION = "0.26.0"
UV_VERSION = "0.13.9"  # the uv the collection's tests pin (tests/helpers/tiny_repo.py)


def default_dir() -> str:
    return os.environ.get("REAL_VLLM_DIR") or str(ROOT / ".cache" / "real-vllm")


def base_python() -> str:
    """The interpreter behind the running venv (a pyenv shim or venv python would be a wrapper)."""
    for name in (f"python{sys.version_info[0]}.{sys.version_info[1]}", "python3"):
        candidate = os.path.join(sys.base_prefix, "bin", name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("python3") or sys.executable


def ensure_uv(directory: str) -> str:
    """A bin dir holding only `uv` (put first on PATH: a venv's bin would also shadow python3)."""
    bindir = os.path.join(directory, "tools", "bin")
    link = os.path.join(bindir, "uv")
    if os.access(link, os.X_OK):
        return bindir
    found = shutil.which("uv")
    if not found:
        venv = os.path.join(directory, "tools", "venv")
        subprocess.run([base_python(), "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", f"uv=={UV_VERSION}"], check=True)
        found = os.path.join(venv, "bin", "uv")
    os.makedirs(bindir, exist_ok=True)
    os.symlink(found, link)
    return bindir


def prepare(directory: str) -> Dict[str, Any]:
    """sdist, wheel, uv and the fork repo under `directory`; returns their paths and the repo's commits."""
    os.makedirs(os.path.join(directory, "logs"), exist_ok=True)
    started = time.monotonic()
    sdist = sources.fetch_sdist("vllm", VERSION, os.path.join(directory, "sdist"))
    wheel = sources.fetch_wheel(sys.executable, "vllm", VERSION, os.path.join(directory, "wheels"))
    bindir = ensure_uv(directory)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    repo = os.path.join(directory, "vllm")
    commits = sources.commits(repo) if os.path.isdir(os.path.join(repo, ".git")) else {}
    if any(fork.branch not in commits for fork in sources.FORKS) or f"v{VERSION}" not in commits:
        commits = sources.make_repo(sdist, repo, VERSION)
    return {
        "sdist": sdist,
        "wheel": wheel,
        "repo": repo,
        "commits": commits,
        "uv": subprocess.run(["uv", "--version"], capture_output=True, text=True, check=True).stdout.strip(),
        "prepare_seconds": round(time.monotonic() - started, 1),
    }


def build_params(**given: Any) -> Dict[str, Any]:
    """vllm_build's parameters as the module would validate them: the argument spec's defaults + `given`."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build

    params = {name: spec.get("default") for name, spec in _build.BUILD_ARGUMENT_SPEC.items()}
    unknown = set(given) - set(params)
    if unknown:
        raise SystemExit(f"options not in vllm_build's argument spec: {sorted(unknown)}")
    params.update(given)
    return params


def wheel_commit_options() -> Dict[str, str]:
    """`precompiled_wheel_commit: v<version>` where vllm_build has the option: the release wheel's own commit
    (upstream's, in its vllm/_version.py) is not in a repo made from the sdist; its tag is."""
    return {"precompiled_wheel_commit": f"v{VERSION}"} if "precompiled_wheel_commit" in build_params() else {}


def run_build(params: Dict[str, Any], check_mode: bool, **own: Any) -> Dict[str, Any]:
    """vllm_build's core; `own`: its options that name no release (python_only)."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build

    return _build.build(_build.build_options(params, **own), check_mode=check_mode)


def seed_mirror(root: str, repo: str) -> None:
    """Check mode reads the mirror as it is; a host that built once holds it (fetch it like a build would)."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _git

    url = _git.normalize_repo(repo)
    _git.ensure_mirror(url, _git.mirror_path(root, url), 600.0)


def decisions(env: Dict[str, Any], root: str, python: str, **extra: Any) -> List[Dict[str, Any]]:
    """Check mode on every fork branch with the options a user gives (+ `extra` options)."""
    seed_mirror(root, env["repo"])
    rows = []
    for fork in sources.FORKS:
        if fork.branch == "upstream-next":
            continue  # the stale base's line itself, not a fork ref
        params = build_params(
            repo=env["repo"],
            ref=fork.branch,
            root=root,
            python=python,
            installer="uv",
            precompiled="auto",
            precompiled_wheel=env["wheel"],
            precompiled_base=fork.base,
            **extra,
        )
        started = time.monotonic()
        try:
            result = run_build(params, check_mode=True)
            decided, reason, error = result.get("precompiled"), result.get("precompiled_reason"), None
        except Exception as exc:  # a refusal is a finding to record, not a crash of the lane
            result, decided, reason, error = {}, None, None, f"{type(exc).__name__}: {exc}"
        rows.append(
            {
                "branch": fork.branch,
                "changes": fork.what,
                "path": fork.path,
                "precompiled_base": fork.base,
                "commit": env["commits"][fork.branch],
                "decided": decided,
                "right": fork.precompiled,
                "ok": decided is not None and bool(decided) == fork.precompiled,
                "reason": reason,
                "error": error,
                "details": {
                    k: v for k, v in result.items() if k.startswith("precompiled_") and k != "precompiled_reason"
                },
                "seconds": round(time.monotonic() - started, 2),
            }
        )
    return rows


def overlay_lines(log_path: Optional[str]) -> List[str]:
    if not log_path or not os.path.isfile(log_path):
        return []
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        return [line.strip() for line in handle if "wheel overlay" in line or "linked install" in line]


def installed_check(release: str) -> Dict[str, Any]:
    """The release's installed vLLM against its own RECORD (sha256 of every file listed), and how many of
    its files are hard links shared with other releases (the linked install's libraries)."""
    records = glob.glob(os.path.join(release, "venv", "lib", "python*", "site-packages", "vllm-*.dist-info", "RECORD"))
    if len(records) != 1:
        return {"error": f"{len(records)} installed vllm RECORD files"}
    site = os.path.dirname(os.path.dirname(records[0]))
    checked, bad, shared, shared_bytes = 0, [], 0, 0
    with open(records[0], encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if len(row) < 3 or not row[1]:
                continue
            path = os.path.join(site, row[0])
            digest = hashlib.sha256()
            with open(path, "rb") as member:
                for chunk in iter(lambda: member.read(1 << 20), b""):
                    digest.update(chunk)
            expected = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
            checked += 1
            if expected != row[1]:
                bad.append(row[0])
            stat = os.stat(path)
            if stat.st_nlink > 1 and stat.st_size >= 1 << 20:
                shared += 1
                shared_bytes += stat.st_size
    return {"files": checked, "not_matching": bad, "shared_large_files": shared, "shared_bytes": shared_bytes}


def du(path: str) -> Optional[int]:
    """Bytes on disk under `path`, hard links counted once (`du -s` of one invocation)."""
    if not os.path.exists(path):
        return None
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def forget_releases(root: str, commit: str) -> List[str]:
    """Remove the lane's earlier releases (and wheels) of `commit`, so that a re-run builds and measures again."""
    removed = []
    for sub in ("releases", "wheels"):
        directory = os.path.join(root, sub)
        for name in os.listdir(directory) if os.path.isdir(directory) else []:
            if name.startswith(commit[:12] + "-"):
                shutil.rmtree(os.path.join(directory, name))
                removed.append(f"{sub}/{name}")
    return removed


def python_only_params(env: Dict[str, Any], root: str, python: str, ref: str, **extra: Any) -> Dict[str, Any]:
    """vllm_build's options for a precompiled uv build of `ref` over the release wheel (lane and bench)."""
    return build_params(
        **extra,
        repo=env["repo"],
        ref=ref,
        root=root,
        python=python,
        installer="uv",
        precompiled="auto",
        precompiled_wheel=env["wheel"],
        precompiled_base="main",
    )


def real_build(
    env: Dict[str, Any], root: str, python: str, ref: str, python_only: str = "auto", **extra: Any
) -> Dict[str, Any]:
    params = python_only_params(env, root, python, ref, **extra)
    started = time.monotonic()
    result = run_build(params, check_mode=False, python_only=python_only)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    return result


def _members(path: str) -> Tuple[Dict[str, str], int]:
    """sha256 of every member of a wheel, and how many RECORD lines disagree with the members."""
    digests = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            digest = hashlib.sha256()
            with archive.open(info) as member:
                for chunk in iter(lambda: member.read(1 << 20), b""):
                    digest.update(chunk)
            digests[info.filename] = digest.hexdigest()
        record = next(name for name in digests if name.count("/") == 1 and name.endswith(".dist-info/RECORD"))
        bad = 0
        for row in csv.reader(io.StringIO(archive.read(record).decode("utf-8"))):
            if row and row[0] != record:
                want = (
                    "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(digests.get(row[0], ""))).rstrip(b"=").decode()
                )
                bad += row[1] != want or int(row[2]) != archive.getinfo(row[0]).file_size
    return digests, bad


def compare_with_plain_build(env: Dict[str, Any], root: str, build: Dict[str, Any]) -> Dict[str, Any]:
    """vLLM's own precompiled build of the same commit (`uv build`, the real wheel as location, no overlay),
    compared member by member with the wheel vllm_build made: the wheel overlay's correctness on real vLLM."""
    work = os.path.join(os.path.dirname(root), "plain-build")
    shutil.rmtree(work, ignore_errors=True)
    src = os.path.join(work, "src")
    subprocess.run(["git", "clone", "-q", "--no-checkout", env["repo"], src], check=True)
    subprocess.run(["git", "-C", src, "checkout", "-q", "--detach", build["commit"]], check=True)
    environ = dict(
        os.environ,
        UV_CACHE_DIR=os.path.join(root, "cache", "uv"),
        VLLM_USE_PRECOMPILED="1",
        VLLM_PRECOMPILED_WHEEL_LOCATION=env["wheel"],
    )
    python = os.path.join(build["release"], "venv", "bin", "python")
    started = time.monotonic()
    with open(os.path.join(work, "build.log"), "w", encoding="utf-8") as log:
        subprocess.run(
            ["uv", "build", "--wheel", "--python", python, "--out-dir", os.path.join(work, "dist"), src],
            check=True,
            env=environ,
            stdout=log,
            stderr=log,
        )
    seconds = round(time.monotonic() - started, 1)
    plain = os.path.join(work, "dist", os.listdir(os.path.join(work, "dist"))[0])
    ours, ours_bad = _members(build["wheel"])
    theirs, theirs_bad = _members(plain)
    differ = sorted(name for name in set(ours) | set(theirs) if ours.get(name) != theirs.get(name))
    retagged = _only_retagged(build["wheel"], plain, env["wheel"], differ)
    if retagged:
        differ = []
    shutil.rmtree(work, ignore_errors=True)
    return {
        "retagged": retagged,
        "plain_wheel": os.path.basename(plain),
        "plain_build_seconds": seconds,
        "members": len(ours),
        "differ": differ[:20],
        "identical": not differ,
        "record_bad_lines": {"vllm_build": ours_bad, "plain": theirs_bad},
    }


def _only_retagged(ours: str, theirs: str, base: str, differ: List[str]) -> Optional[str]:
    """The base wheel's tags when the two wheels differ only as _wheel_tags retags: WHEEL's Tag lines (ours the
    base wheel's) and RECORD's line of WHEEL; else None (a real difference)."""
    import csv
    import io
    import zipfile

    def read(path: str, suffix: str) -> str:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(suffix))
            return archive.read(name).decode("utf-8")

    def split(text: str) -> Tuple[List[str], List[str]]:
        lines = text.splitlines()
        return [line for line in lines if not line.startswith("Tag:")], [
            line for line in lines if line.startswith("Tag:")
        ]

    def rows(text: str) -> Dict[str, List[str]]:
        return {
            r[0]: r
            for r in csv.reader(io.StringIO(text))
            if r and not r[0].endswith((".dist-info/WHEEL", ".dist-info/RECORD"))
        }

    if not differ or any(not name.endswith((".dist-info/WHEEL", ".dist-info/RECORD")) for name in differ):
        return None
    (ours_rest, ours_tags), (theirs_rest, _tags) = (
        split(read(ours, ".dist-info/WHEEL")),
        split(read(theirs, ".dist-info/WHEEL")),
    )
    base_tags = split(read(base, ".dist-info/WHEEL"))[1]
    same_record = rows(read(ours, ".dist-info/RECORD")) == rows(read(theirs, ".dist-info/RECORD"))
    if ours_rest == theirs_rest and ours_tags == base_tags and same_record:
        return " ".join(tag.split(":", 1)[1].strip() for tag in ours_tags)
    return None


def _tree(venv: str) -> Dict[str, Tuple[str, Any]]:
    """Every entry of a venv but __pycache__ (what running it left): (kind, inode or link text), by path."""
    entries: Dict[str, Tuple[str, Any]] = {}
    for top, dirs, files in os.walk(venv):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = os.path.join(top, name)
            relative = os.path.relpath(path, venv)
            entries[relative] = ("link", os.readlink(path)) if os.path.islink(path) else ("file", os.stat(path).st_ino)
    return entries


def _same_file(first: str, second: str) -> bool:
    if os.path.basename(first) == "RECORD":  # its order is no part of its meaning (uv's differs run to run)
        with open(first, "rb") as a, open(second, "rb") as b:
            return sorted(a.read().splitlines()) == sorted(b.read().splitlines())
    with open(first, "rb") as a, open(second, "rb") as b:
        while True:
            chunk = a.read(1 << 20)
            if chunk != b.read(1 << 20):
                return False
            if not chunk:
                return True


def compare_venvs(reference: str, made: str) -> Dict[str, Any]:
    """The installed files of two venvs of the same path, byte for byte (a shared inode is the same bytes)."""
    ours, theirs = _tree(made), _tree(reference)
    differ = []
    for name in sorted(set(ours) & set(theirs)):
        (kind, ino), (other_kind, other_ino) = ours[name], theirs[name]
        if (
            kind != other_kind
            or (kind == "link" and ino != other_ino)
            or (
                kind == "file"
                and ino != other_ino
                and not _same_file(os.path.join(made, name), os.path.join(reference, name))
            )
        ):
            differ.append(name)
    return {
        "files": len(ours),
        "shared_inodes": sum(1 for n in set(ours) & set(theirs) if ours[n] == theirs[n]),
        "differ": differ,
        "only_fast": sorted(set(ours) - set(theirs)),
        "only_reference": sorted(set(theirs) - set(ours)),
    }


# A pure-Python dependency of vLLM that has older releases on PyPI (idna: requests, httpx, aiohttp's yarl).
AGED_DEPENDENCY = "idna"


def age_a_dependency(root: str, release: str, name: str) -> Dict[str, Any]:
    """The earlier release made as an older index would have made it: `name` one release back (uv, same cache).
    The bump must give the version a fresh install gets now (the full build's), as after a real index move."""
    python = os.path.join(release, "venv", "bin", "python")
    show = [python, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"]
    now = subprocess.run(show, capture_output=True, text=True, check=True).stdout.strip()
    environ = dict(os.environ, UV_CACHE_DIR=os.path.join(root, "cache", "uv"))
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", python, "--no-deps", f"{name}<{now}"], check=True, env=environ
    )
    return {
        "name": name,
        "built": now,
        "aged": subprocess.run(show, capture_output=True, text=True, check=True).stdout.strip(),
    }


def python_only_bump(env: Dict[str, Any], root: str, python: str, reference: Dict[str, Any], **named: Any) -> Dict:
    """fork/python again, by the python-only bump from the `main` release, against `reference` (the full
    precompiled build of fork/python, moved aside): every installed file and every wheel member compared."""
    aside = os.path.join(os.path.dirname(root), "reference")
    shutil.rmtree(aside, ignore_errors=True)
    os.makedirs(aside)
    ref_release, ref_wheels = os.path.join(aside, "release"), os.path.join(aside, "wheels")
    os.rename(reference["release"], ref_release)
    os.rename(os.path.dirname(reference["wheel"]), ref_wheels)
    forget_releases(root, env["commits"]["main"])
    earlier = real_build(env, root, python, "main", python_only="never", **named)
    aged = age_a_dependency(root, earlier["release"], AGED_DEPENDENCY)
    fast = real_build(env, root, python, "fork/python", **named)
    record: Dict[str, Any] = {
        "aged": aged,
        "earlier": {k: earlier.get(k) for k in ("release_name", "precompiled", "duration", "stage_seconds")},
        "fast": {k: fast.get(k) for k in ("release_name", "python_only", "duration", "stage_seconds", "wall_seconds")},
    }
    if fast["release_name"] != reference["release_name"]:
        record["error"] = f"the bump made {fast['release_name']}, not {reference['release_name']}"
        return record
    record["installed"] = installed_check(fast["release"])
    record["venv"] = compare_venvs(os.path.join(ref_release, "venv"), os.path.join(fast["release"], "venv"))
    ours, _bad = _members(fast["wheel"])
    theirs, _bad = _members(os.path.join(ref_wheels, os.path.basename(reference["wheel"])))
    differ = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
    for name in [n for n in differ if n.endswith(".dist-info/RECORD")]:  # RECORD: its lines, not their order
        with zipfile.ZipFile(fast["wheel"]) as a, zipfile.ZipFile(
            os.path.join(ref_wheels, os.path.basename(reference["wheel"]))
        ) as b:
            if sorted(a.read(name).splitlines()) == sorted(b.read(name).splitlines()):
                differ.remove(name)
    record["wheel_members_differ"] = differ
    shutil.rmtree(aside, ignore_errors=True)
    return record


def facts(root: str, release: str) -> Dict[str, Any]:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _facts

    started = time.monotonic()
    try:
        found = _facts.gather_facts(root=root, venv=os.path.join(release, "venv"), timeout=900.0)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": round(time.monotonic() - started, 1)}
    data = dict(found["facts"], warnings=found.get("warnings", []))
    data["seconds"] = round(time.monotonic() - started, 1)
    return data


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _gib(size: Optional[int]) -> str:
    return "-" if size is None else f"{size / 1024**3:.2f} GiB"


def report(record: Dict[str, Any]) -> str:
    env, build, found = record["env"], record.get("build") or {}, record.get("facts") or {}
    lines = [
        f"# Real vLLM lane: {record['date']}",
        "",
        f"Written by `make real-vllm` (tests/real_vllm/lane.py) at {record['finished_at']}, on {record['machine']}.",
        f"Collection commit: `{record['collection_commit']}`. vLLM {VERSION} sdist `{os.path.basename(env['sdist'])}`,"
        f" base wheel `{os.path.basename(env['wheel'])}`, {env['uv']}, python {record['python_version']}.",
        f"Repo made from the sdist: `main` = `v{VERSION}` = `{env['commits']['main'][:12]}`; each fork branch changes"
        " one thing (tests/real_vllm/sources.py); commits have fixed dates, so the SHAs are the same on every machine.",
        "",
        "## The precompiled decision (check mode, `precompiled: auto`, the release wheel as `precompiled_wheel`)",
        "",
        "| branch | changes | precompiled_base | decided | right answer | ok | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in record["decisions"]:
        decided = {True: "precompiled", False: "full build", None: "error"}[row["decided"]]
        right = "precompiled" if row["right"] else "full build"
        lines.append(
            f"| `{row['branch']}` | {_cell(row['changes'])} | `{row['precompiled_base']}` | {decided} | {right} | "
            f"{'yes' if row['ok'] else '**NO**'} | {_cell(row['reason'] or row['error'])} |"
        )
    wrong = [row["branch"] for row in record["decisions"] if not row["ok"]]
    lines += ["", f"Wrong decisions: {', '.join(wrong) if wrong else 'none'}.", ""]
    if record.get("decisions_named"):
        lines += [
            f"### The same, with `precompiled_wheel_commit: v{VERSION}`",
            "",
            "| branch | decided | right answer | ok | reason |",
            "|---|---|---|---|---|",
        ]
        for row in record["decisions_named"]:
            decided = {True: "precompiled", False: "full build", None: "error"}[row["decided"]]
            lines.append(
                f"| `{row['branch']}` | {decided} | {'precompiled' if row['right'] else 'full build'} | "
                f"{'yes' if row['ok'] else '**NO**'} | {_cell(row['reason'] or row['error'])} |"
            )
        wrong = [row["branch"] for row in record["decisions_named"] if not row["ok"]]
        lines += ["", f"Wrong decisions: {', '.join(wrong) if wrong else 'none'}.", ""]
    build_options = record.get("build_options") or {}
    if build_options:
        lines += [f"The real build below was given: `{json.dumps(build_options)}`.", ""]
    if not build:
        return "\n".join([*lines, f"Prepare (downloads, uv, repo): {env['prepare_seconds']} s.", ""])
    lines += ["## A real build of `fork/python` (precompiled path, uv)", ""]
    if build.get("error"):
        lines += [f"FAILED: {_cell(build['error'])}", ""]
    else:
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in (build.get("stage_seconds") or {}).items())
        lines += [
            f"- release `{build.get('release_name')}`, wheel `{os.path.basename(build.get('wheel') or '')}`",
            f"- precompiled: {build.get('precompiled')} ({_cell(build.get('precompiled_reason'))})",
            f"- cache: {record['cache_state']}; duration {build.get('duration')} s; stages: {stages}",
            f"- disk: release {_gib(record['disk'].get('release'))}, wheel {_gib(record['disk'].get('wheel'))}, "
            f"uv cache {_gib(record['disk'].get('uv_cache'))}, releases/ + cache together "
            f"{_gib(record['disk'].get('root_shared'))} (hard links counted once)",
            "",
        ]
    for line in record.get("overlay_log") or []:
        lines.append(f"- log: `{line}`")
    installed = record.get("installed")
    if installed:
        lines.append(
            f"- installed vLLM against its RECORD: {installed.get('error') or ''}{installed.get('files')} files "
            "hashed, "
            f"{len(installed.get('not_matching') or [])} not matching; {installed.get('shared_large_files')} files of "
            f"1 MiB or more are hard links ({_gib(installed.get('shared_bytes'))})"
        )
    compare = record.get("compare")
    if compare:
        if compare.get("error"):
            lines += ["", f"Comparison with vLLM's own precompiled build FAILED: {_cell(compare['error'])}"]
        else:
            verdict = (
                (
                    "all identical (sha256 each)"
                    if not compare.get("retagged")
                    else f"identical (sha256 each) but WHEEL's tags: the base wheel's {compare['retagged']}"
                )
                if compare["identical"]
                else "DIFFERENT: " + ", ".join(compare["differ"])
            )
            lines += [
                "",
                f"Against vLLM's own precompiled build of the same commit (`uv build`, the real wheel as location, "
                f"no overlay; {compare['plain_build_seconds']} s): {compare['members']} members, "
                f"{verdict}"
                f"; RECORD lines that do not match their member: {compare['record_bad_lines']}.",
            ]
    bump = record.get("python_only")
    if bump:
        lines += ["", "## The python-only bump: `fork/python` again, from the `main` release (python_only: auto)", ""]
        if bump.get("error"):
            lines += [f"FAILED: {_cell(bump['error'])}"]
        else:
            fast, earlier, venv = bump["fast"], bump["earlier"], bump.get("venv") or {}
            stages = ", ".join(f"{k} {v:.1f} s" for k, v in (fast.get("stage_seconds") or {}).items())
            lines += [
                f"- the earlier release `{earlier['release_name']}` (`main`, python_only: never): "
                f"{earlier['duration']} s",
                f"- the bump: `{fast['release_name']}` in {fast['duration']} s ({stages}); "
                f"python_only: `{_cell(json.dumps(fast['python_only']))}`",
                f"- installed vLLM against its RECORD: {bump['installed'].get('files')} files hashed, "
                f"{len(bump['installed'].get('not_matching') or [])} not matching",
                "- the earlier release aged as an older index would have made it: "
                f"{_cell(json.dumps(bump.get('aged')))} (the bump must install what a fresh install gets now: "
                "`python_only.dependencies`)",
                f"- against the full precompiled build of the same commit (above, moved aside): {venv.get('files')} "
                f"installed files ({venv.get('shared_inodes')} the same inode), differing: "
                f"{', '.join(f'`{n}`' for n in venv.get('differ') or []) or 'none'}; only in the bump: "
                f"{venv.get('only_fast') or 'none'}; only in the build: {venv.get('only_reference') or 'none'}"
                " (RECORD compared as its set of lines; `uv_cache.json` is uv's record of the wheel file's mtime)",
                f"- wheel members differing (sha256 each): {bump['wheel_members_differ'] or 'none'}",
            ]
    lines += ["", "## vllm_facts on that release (CPU-only host: no GPU driver)", ""]
    if found.get("error"):
        lines += [f"FAILED: {_cell(found['error'])}", ""]
    elif found:
        extensions = found.get("extensions") or {}
        lines += [
            f"- version `{found.get('version')}`, commit `{found.get('commit')}` (from {found.get('commit_source')}), "
            f"torch {found.get('torch_version')}, took {found.get('seconds')} s",
            f"- extensions found: {len(extensions)}; loaded: {sum(1 for e in extensions.values() if e.get('ok'))}",
            "",
            "| extension | ok | error |",
            "|---|---|---|",
        ]
        for name, ext in sorted(extensions.items()):
            lines.append(f"| `{name}` | {ext.get('ok')} | {_cell((ext.get('error') or '')[:160])} |")
        lines.append("")
    lines += [f"Prepare (downloads, uv, repo): {env['prepare_seconds']} s. Raw record: `<dir>/lane-result.json`.", ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=default_dir(), help="where the heavy data lives (default %(default)s)")
    parser.add_argument("--out", default=None, help="the markdown report (default docs/real-vllm/<UTC date>.md)")
    parser.add_argument("--skip-build", action="store_true", help="decisions only")
    parser.add_argument("--skip-compare", action="store_true", help="no plain vLLM build to compare the wheel with")
    parser.add_argument("--skip-python-only", action="store_true", help="no python-only bump of fork/python")
    args = parser.parse_args(argv)
    directory = os.path.abspath(args.dir)
    env = prepare(directory)
    root = os.path.join(directory, "root")
    python = base_python()
    cache_state = "warm" if os.path.isdir(os.path.join(root, "cache", "uv")) else "cold"
    record: Dict[str, Any] = {"env": env, "python_version": platform.python_version(), "cache_state": cache_state}
    # Check mode would find the release an earlier run built and report that run's decision.
    record["removed_before_build"] = [
        removed for fork in sources.FORKS for removed in forget_releases(root, env["commits"][fork.branch])
    ]
    record["decisions"] = decisions(env, root, python)
    # The release wheel's own commit (vllm/_version.py) is upstream's, absent from a repo made from the sdist:
    # the same rows with the commit named, as a user of such a repo would (when the option exists).
    named = wheel_commit_options()
    record["decisions_named"] = decisions(env, root, python, **named) if named else []
    record["disk"] = {}
    if not args.skip_build:
        record["build_options"] = named
        try:
            build = real_build(env, root, python, "fork/python", python_only="never", **named)
        except Exception as exc:
            build = {"error": f"{type(exc).__name__}: {exc}"}
        record["build"] = build
        if build.get("release"):
            record["overlay_log"] = overlay_lines(build.get("log_path"))
            record["facts"] = facts(root, build["release"])
            record["installed"] = installed_check(build["release"])
            if not args.skip_compare:
                try:
                    record["compare"] = compare_with_plain_build(env, root, build)
                except Exception as exc:
                    record["compare"] = {"error": f"{type(exc).__name__}: {exc}", "identical": False}
            if not args.skip_python_only:
                try:
                    record["python_only"] = python_only_bump(env, root, python, build, **named)
                except Exception as exc:
                    record["python_only"] = {"error": f"{type(exc).__name__}: {exc}"}
            record["disk"] = {
                "release": du(build["release"]),
                "wheel": os.path.getsize(build["wheel"]) if build.get("wheel") else None,
                "uv_cache": du(os.path.join(root, "cache", "uv")),
                "root_shared": int(
                    subprocess.run(
                        ["du", "-sbc", os.path.join(root, "releases"), os.path.join(root, "cache")],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    .stdout.splitlines()[-1]
                    .split()[0]
                ),
            }
    now = datetime.datetime.now(datetime.timezone.utc)
    record["date"] = now.strftime("%Y-%m-%d")
    record["finished_at"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    record["machine"] = f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}"
    record["collection_commit"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with open(os.path.join(directory, "lane-result.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True, default=str)
    out = args.out or str(ROOT / "docs" / "real-vllm" / f"{record['date']}.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(report(record))
    print(f"wrote {out}")
    failed = [row["branch"] for row in record["decisions"] + record["decisions_named"] if not row["ok"]]
    broken = (record.get("build") or {}).get("error") or (record.get("facts") or {}).get("error")
    broken = broken or (record.get("compare") is not None and not record["compare"].get("identical"))
    bump = record.get("python_only")
    if bump is not None:
        venv = bump.get("venv") or {}
        expected = all(name.endswith(("/RECORD", "/uv_cache.json")) for name in venv.get("differ") or [])
        used = (bump.get("fast") or {}).get("python_only", {}).get("used")
        aged = bump.get("aged") or {}
        settled = ((bump.get("fast") or {}).get("python_only") or {}).get("dependencies") or {}
        # The aged dependency is back at the version a fresh install gets (the venv comparison says it is the build's).
        used = used and f"{aged.get('name')}=={aged.get('built')}" in (settled.get("installed") or [])
        broken = (
            broken
            or bump.get("error")
            or not used
            or not expected
            or venv.get("only_fast")
            or venv.get("only_reference")
            or bump.get("wheel_members_differ")
            or (bump.get("installed") or {}).get("not_matching")
        )
    if not args.skip_build and broken:
        failed.append("build/facts")
    if failed:
        print(f"real-vllm lane: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
