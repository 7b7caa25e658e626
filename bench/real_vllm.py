# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real-vLLM bench (`make bench-real-vllm`): a python-only bump with vllm_build vs the bare uv command.

Side by side in one run, on the warm uv cache the real-vLLM lane leaves (tests/real_vllm/lane.py; run
first, or this runs its warm-up build), each on a new python-only commit of the lane's fork repo:

  A  vllm_build's core (precompiled: auto, the 0.26.0 wheel as precompiled_wheel, uv), its duration;
  B  what a person types: a fresh `uv venv`, then
     VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_LOCATION=<wheel> uv pip install "vllm @ git+file://<repo>@<ref>"
     with the same UV_CACHE_DIR, wall clock of both commands.

Figure: A / B per round, all rounds and their median (goal <= 0.2: A is the python-only bump, _python_only,
from the newest earlier release; its result's python_only says whether it was used). Also: where A's build
stage goes (the build log's lines time-stamped as they are written), disk for the releases (`du` counts hard
links once), and the cold lane figure.
    .venv/bin/python bench/real_vllm.py [--dir DIR] [--rounds N] [--keep-bare]
    .venv/bin/python bench/real_vllm.py --cold [--keep-cold]    (cold uv, then cold pip: all downloaded)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real_vllm"))
import lane  # noqa: E402
import sources  # noqa: E402

RESULTS = ROOT / "bench" / "results"


class LogClock:
    """Time-stamps the lines of a growing file as they appear (polls; the build log has no per-line times)."""

    def __init__(self, path_of: Any, interval: float = 0.2) -> None:
        self.path_of = path_of  # a callable: the file may only be named once the build has started
        self.interval = interval
        self.lines: List[Tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def __enter__(self) -> LogClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        path, offset, pending = None, 0, b""
        while True:
            stopping = self._stop.is_set()
            path = path or self.path_of()
            if path and os.path.exists(path):
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
                offset += len(data)
                *complete, pending = (pending + data).split(b"\n")
                now = round(time.monotonic() - self.started, 2)
                self.lines.extend((now, line.decode("utf-8", "replace")) for line in complete)
            if stopping:
                return
            time.sleep(self.interval)


def phases(lines: List[Tuple[float, str]]) -> Dict[str, Any]:
    """Where a precompiled `uv build` of vLLM spends its time, from its time-stamped output."""

    def times(pattern: str) -> List[float]:
        return [at for at, text in lines if re.search(pattern, text)]

    command = times(r"\$ uv build |PEP 517 hooks in one process")
    runs = times(r"Using user-specified precompiled wheel location")
    extract = times(r"^\[extract\] ")
    copying = times(r"^copying ")
    adding = times(r"^adding '")
    built = times(r"^Successfully built |^vllm_build-pep517-result ")
    end = times(r"\] exit \d+ after")
    start = command[0] if command else 0.0
    marks = {
        "build command starts": start,
        "setup.py runs (get_requires, build_wheel) start at": [round(t - start, 1) for t in runs],
        "first [extract]": extract[0] - start if extract else None,
        "last [extract]": extract[-1] - start if extract else None,
        "build_py/install copying": (copying[0] - start, copying[-1] - start) if copying else None,
        "zip (adding ...)": (adding[0] - start, adding[-1] - start) if adding else None,
        "the wheel is built": built[0] - start if built else None,
        "build command ends": next((t - start for t in end if t >= (built[0] if built else start)), None),
    }
    return {key: (round(v, 1) if isinstance(v, float) else v) for key, v in marks.items()}


def next_bump(repo: str) -> int:
    branches = sources.commits(repo)
    numbers = [int(name.rsplit("-", 1)[1]) for name in branches if re.fullmatch(r"bench/bump-\d+", name)]
    return max(numbers, default=0) + 1


def measure_vllm_build(env: Dict[str, Any], root: str, python: str, ref: str) -> Dict[str, Any]:
    status = os.path.join(root, "build-status.json")
    run_id = f"bench-{ref}-{time.time():.0f}"

    def log_path() -> Optional[str]:
        try:
            with open(status, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        mine = data.get("run_id") == run_id and data.get("stage") in ("build", "install")
        return data.get("log_path") if mine else None

    params = lane.python_only_params(env, root, python, ref, **lane.wheel_commit_options())
    started = time.monotonic()
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build

    with LogClock(log_path) as clock:
        result = _build.build(_build.build_options(params, run_id=run_id))
    wall = round(time.monotonic() - started, 2)
    return {
        "ref": ref,
        "commit": result["commit"],
        "release": result["release"],
        "release_name": result["release_name"],
        "built": result["built"],
        "precompiled": result["precompiled"],
        "duration": result["duration"],
        "wall": wall,
        "stage_seconds": result["stage_seconds"],
        "python_only": result.get("python_only"),
        "wheel": result["wheel"],
        "log_path": result["log_path"],
        "phases": phases(clock.lines),
        "overlay": [line[1] for line in clock.lines if "wheel overlay" in line[1] or "linked install" in line[1]],
    }


def forget_bare_build(cache: str) -> None:
    """Drop what one bare run leaves in the shared uv cache: its checkout of the bump commit and the wheel
    uv built from it (~1.5 GB a run). No later run can reuse them (every measurement is a new commit); the
    git objects (git-v2/db) and the dependencies' wheels stay warm for both sides."""
    for bucket in (os.path.join(cache, "git-v2", "checkouts"), os.path.join(cache, "sdists-v11", "git")):
        for entry in os.listdir(bucket) if os.path.isdir(bucket) else []:
            shutil.rmtree(os.path.join(bucket, entry), ignore_errors=True)
    subprocess.run(["uv", "cache", "prune", "--cache-dir", cache], check=False, capture_output=True)


def measure_bare(env: Dict[str, Any], root: str, python: str, ref: str, keep: bool) -> Dict[str, Any]:
    """The bare command on the same warm uv cache, into a fresh venv (both commands timed)."""
    work = os.path.join(os.path.dirname(root), "bare", ref.replace("/", "-"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    venv = os.path.join(work, "venv")
    environ = dict(
        os.environ,
        UV_CACHE_DIR=os.path.join(root, "cache", "uv"),
        VLLM_USE_PRECOMPILED="1",
        VLLM_PRECOMPILED_WHEEL_LOCATION=env["wheel"],
    )
    requirement = f"vllm @ git+file://{env['repo']}@{ref}"
    log = os.path.join(work, "install.log")
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        subprocess.run(["uv", "venv", "--python", python, venv], check=True, env=environ, stdout=out, stderr=out)
        venv_done = time.monotonic()
        subprocess.run(
            ["uv", "pip", "install", "--python", os.path.join(venv, "bin", "python"), requirement],
            check=True,
            env=environ,
            stdout=out,
            stderr=out,
        )
    finished = time.monotonic()
    version = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    size = lane.du(venv)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
        forget_bare_build(environ["UV_CACHE_DIR"])
    return {
        "ref": ref,
        "command": f"VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_LOCATION=<wheel> uv pip install {requirement!r}",
        "venv_seconds": round(venv_done - started, 2),
        "install_seconds": round(finished - venv_done, 2),
        "seconds": round(finished - started, 2),
        "version": version,
        "venv_bytes": size,
    }


def measure_cold(env: Dict[str, Any], directory: str, python: str, installer: str, keep: bool) -> Dict[str, Any]:
    """vllm_build of fork/python into a new root: every cache under it empty (installer's, stub), all downloaded."""
    root = os.path.join(directory, f"cold-{installer}")
    shutil.rmtree(root, ignore_errors=True)
    params = dict(lane.python_only_params(env, root, python, "fork/python", **lane.wheel_commit_options()))
    params["installer"] = installer
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build

    started = time.monotonic()
    result = _build.build(_build.build_options(params, run_id=f"bench-cold-{installer}"))
    record = {
        "installer": installer,
        "duration": result["duration"],
        "wall": round(time.monotonic() - started, 2),
        "stage_seconds": result["stage_seconds"],
        "release_bytes": lane.du(result["release"]),
        "root_bytes": lane.du(root),
    }
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return record


def disk(root: str) -> Dict[str, Any]:
    releases = os.path.join(root, "releases")
    names = sorted(n for n in os.listdir(releases) if os.path.isfile(os.path.join(releases, n, "manifest.json")))
    each = {name: lane.du(os.path.join(releases, name)) for name in names}

    def together(*paths: str) -> int:
        out = subprocess.run(["du", "-sbc", *paths], capture_output=True, text=True, check=True).stdout
        return int(out.splitlines()[-1].split()[0])

    one = min(each.values()) if each else None
    all_releases = together(releases) if names else None
    with_caches = together(releases, os.path.join(root, "wheels"), os.path.join(root, "cache")) if names else None
    return {
        "releases": len(names),
        "each_alone": each,
        "releases_together": all_releases,
        "ratio_to_one": round(all_releases / one, 3) if one and all_releases else None,
        "with_wheels_and_cache": with_caches,
    }


def _gib(size: Optional[int]) -> str:
    return "-" if size is None else f"{size / 1024**3:.2f} GiB"


def report(record: Dict[str, Any]) -> str:
    lines = [f"real-vLLM bench, {record['finished_at']}, {record['machine']}, collection {record['collection']}"]
    for cold in record.get("cold", []):
        stages = ", ".join(f"{k} {v:.1f}" for k, v in cold["stage_seconds"].items())
        lines.append(
            f"cold {cold['installer']}: {cold['duration']:.1f} s ({stages}); release {_gib(cold['release_bytes'])}, "
            f"root with caches {_gib(cold['root_bytes'])}"
        )
    if not record["vllm_build"]:
        return "\n".join(lines)
    ratios = []
    for n, (ours, bare) in enumerate(zip(record["vllm_build"], record["bare"]), 1):
        first = "vllm_build first" if n % 2 else "bare first"
        stages = ", ".join(f"{k} {v:.1f}" for k, v in ours["stage_seconds"].items())
        ratios.append(ours["duration"] / bare["seconds"])
        bump = ours.get("python_only") or {}
        lines += [
            f"round {n} ({first}): vllm_build {ours['duration']:.1f} s ({stages}) / bare uv {bare['seconds']:.1f} s "
            f"(venv {bare['venv_seconds']:.1f}, install {bare['install_seconds']:.1f}) = "
            f"{ratios[-1]:.2f}  (goal <= 0.2)",
            f"  python-only bump: used {bump.get('used')}, {bump.get('seconds')} s, from {bump.get('from')}: "
            f"{bump.get('reason')}",
            f"  build stage of vllm_build: {json.dumps(ours['phases'])}",
            f"  {'; '.join(ours['overlay']) or 'no wheel overlay'}",
        ]
    ours_total = sum(r["duration"] for r in record["vllm_build"])
    bare_total = sum(r["seconds"] for r in record["bare"])
    lines.append(
        f"all rounds: {ours_total:.1f} s / {bare_total:.1f} s = {ours_total / bare_total:.2f}; median of the rounds' "
        f"ratios {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}); load {record.get('load')}"
    )
    d = record["disk"]
    lines.append(
        f"disk: {d['releases']} releases together {_gib(d['releases_together'])} vs the smallest alone "
        f"{_gib(min(d['each_alone'].values()) if d['each_alone'] else None)} = {d['ratio_to_one']}x (goal <= 1.1); "
        f"with wheels/ and cache/: {_gib(d['with_wheels_and_cache'])}"
    )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=lane.default_dir(), help="the lane's data directory (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="bump pairs measured, order alternating (default 2)")
    parser.add_argument("--keep-bare", action="store_true", help="keep the bare command's venvs")
    parser.add_argument("--cold", action="store_true", help="instead: fork/python cold with uv, then pip (new roots)")
    parser.add_argument("--keep-cold", action="store_true", help="keep the cold runs' roots (<dir>/cold-*)")
    args = parser.parse_args(argv)
    directory = os.path.abspath(args.dir)
    env = lane.prepare(directory)
    root = os.path.join(directory, "root")
    python = lane.base_python()
    if not args.cold and not os.path.isdir(os.path.join(root, "cache", "uv")):
        print("warm-up: building fork/python once (not measured)", flush=True)
        lane.real_build(env, root, python, "fork/python", **lane.wheel_commit_options())
    record: Dict[str, Any] = {"vllm_build": [], "bare": [], "cold": []}
    for installer in ("uv", "pip") if args.cold else ():
        print(f"cold {installer}: vllm_build fork/python into {directory}/cold-{installer} ...", flush=True)
        record["cold"].append(measure_cold(env, directory, python, installer, args.keep_cold))
    for round_ in range(0 if args.cold else args.rounds):
        n = next_bump(env["repo"])
        ours_ref, bare_ref = f"bench/bump-{n}", f"bench/bump-{n + 1}"
        sources.bump(env["repo"], ours_ref, "main", n)
        sources.bump(env["repo"], bare_ref, "main", n + 1)
        # Alternate which goes first: the machine's load drifts, and the second may find more in the page cache.
        for which in ("ours", "bare") if round_ % 2 == 0 else ("bare", "ours"):
            if which == "ours":
                print(f"vllm_build {ours_ref} ...", flush=True)
                record["vllm_build"].append(measure_vllm_build(env, root, python, ours_ref))
            else:
                print(f"bare uv pip install {bare_ref} ...", flush=True)
                record["bare"].append(measure_bare(env, root, python, bare_ref, args.keep_bare))
    record["disk"] = disk(root) if not args.cold else {}
    now = datetime.datetime.now(datetime.timezone.utc)
    record["finished_at"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    record["machine"] = f"{os.cpu_count()} CPUs"
    record["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())  # the 1/5/15 min load at the end
    record["collection"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    text = report(record)
    out = RESULTS / f"real-vllm-{now.strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.json").write_text(json.dumps(record, indent=1, default=str))
    (out / "figures.txt").write_text(text + "\n")
    print(text)
    print(f"kept in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
