# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The compatibility matrix (docs/compat.md): every probe and capability on each vLLM release.

For each release: download the PyPI wheel, unpack it (the probes read these sources), install it with
its full dependencies (torch and CUDA libraries, gigabytes) into a venv of its own with uv, run the
collection's capability script in that venv (CPU only: no GPU needed), and evaluate the probes of
`roles/vllm/defaults/main.yml` with `vllm_facts`' own code. Writes the captured capabilities to
tests/unit/data/capabilities/<version>.json (what CI tests the preflight against) and the matrix.

Not part of CI: it downloads ~10 GB per release the first time (later runs reuse the cache).

    .venv/bin/python tests/compat/run_compat.py [--cache .cache/compat] [--versions 0.26.0 0.33.0]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = ROOT / ".cache" / "ac"
_LINK = COLLECTIONS / "ansible_collections" / "vllm_ops" / "dflash"
if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.symlink(ROOT, _LINK)
sys.path.insert(0, str(COLLECTIONS))

import yaml  # noqa: E402
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _capability_script as cap  # noqa: E402
from ansible_collections.vllm_ops.dflash.plugins.module_utils._facts import _run_probes, parse_probes  # noqa: E402

VERSIONS = ("0.20.1", "0.22.0", "0.24.0", "0.26.0", "0.28.0", "0.30.0", "0.33.0")
ROLE_DEFAULTS = ROOT / "roles" / "vllm" / "defaults" / "main.yml"
FIXTURES = ROOT / "tests" / "unit" / "data" / "capabilities"
DOC = ROOT / "docs" / "compat.md"
MIN_FREE_GB = 15  # one release venv takes 8-9 GB; stop installing before the disk fills
SCRIPT_TIMEOUT = 1800.0
# Draft architectures of the DFlash family (LiLiCorr is one, by vLLM's registry comments).
DFLASH_FAMILY = ("DFlash", "LiLiCorr")


def log(message: str) -> None:
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {message}", flush=True)


def run(cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=True, text=True, **kwargs)


def free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 1024**3


def fetch_wheel(version: str, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        log(f"{version}: downloading the wheel")
        run([sys.executable, "-m", "pip", "download", "-q", f"vllm=={version}", "--no-deps",
             "--only-binary", ":all:", "-d", str(wheels)])  # fmt: skip
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip downloaded no vllm {version} wheel into {wheels}. Fix: check that PyPI is reachable")
    return found[0]


def unpack(wheel: Path, dest: Path) -> Path:
    """The wheel's files under dest (once: the `.done` marker is written last)."""
    if not (dest / ".done").exists():
        shutil.rmtree(dest, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(dest)
        (dest / ".done").touch()
    return dest / "vllm"


def uv_binary(cache: Path) -> Path:
    uv = cache / "uvtool" / "bin" / "uv"
    if not uv.exists():
        log("installing uv into a venv of its own")
        run([sys.executable, "-m", "venv", str(cache / "uvtool")])
        run([str(cache / "uvtool" / "bin" / "pip"), "install", "-q", "uv"])
    return uv


def release_venv(version: str, cache: Path, python: str) -> Optional[Path]:
    """The python of a venv with vllm==version and its dependencies, or None when the disk is too full."""
    venv = cache / "venvs" / version
    if (venv / ".done").exists():
        return venv / "bin" / "python"
    (cache / "venvs").mkdir(parents=True, exist_ok=True)
    if free_gb(cache / "venvs") < MIN_FREE_GB:
        log(f"{version}: not installed, less than {MIN_FREE_GB} GB free on {cache}")
        return None
    uv = uv_binary(cache)
    env = dict(os.environ, UV_CACHE_DIR=str(cache / "uv"), UV_LINK_MODE="hardlink")
    shutil.rmtree(venv, ignore_errors=True)
    log(f"{version}: installing vllm=={version} with its dependencies")
    run([str(uv), "venv", "-q", "--python", python, str(venv)], env=env)
    run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"vllm=={version}"], env=env)
    (venv / ".done").touch()
    return venv / "bin" / "python"


def capture(python: Path) -> Dict[str, Any]:
    """The capabilities and how long the script took (nearly all of it vLLM's import)."""
    mark = cap.new_mark()
    start = time.monotonic()
    result = subprocess.run(
        cap.capability_command(str(python), mark),
        capture_output=True,
        text=True,
        cwd="/",
        timeout=SCRIPT_TIMEOUT,
        check=False,
    )
    seconds = time.monotonic() - start
    try:
        caps = cap.parse_capability_output(result.stdout, mark)
    except cap.CapabilityError as exc:
        raise SystemExit(f"{python}: {exc}\nstderr: {result.stderr[-3000:]}") from exc
    return {"capabilities": caps, "seconds": round(seconds, 1)}


def evaluate_probes(package_dir: Path, probes: List[Dict[str, Any]]) -> Dict[str, str]:
    """name -> 'yes' | 'no' | 'no file', as vllm_facts would report them on this release."""
    results, errors = _run_probes(str(package_dir), parse_probes(probes))
    return {name: ("no file" if name in errors else "yes" if found else "no") for name, found in results.items()}


def summary(caps: Dict[str, Any], seconds: Optional[float]) -> Dict[str, str]:
    """One cell per capability row of the matrix."""
    methods = caps["speculative_methods"]
    archs = [a for a in caps["registered_architectures"] if any(part in a for part in DFLASH_FAMILY)]
    flags = caps["serve_flags"]
    negatable = flags.get("--enable-prefix-caching", {}).get("negatable")

    def has(name: str) -> str:
        return "yes" if name in methods else "no"

    return {
        "speculative methods (count)": str(len(methods)),
        "MTP aliases (count)": str(len(caps["mtp_aliases"])),
        "method `dflash`": has("dflash"),
        "method `dspark`": has("dspark"),
        "methods `medusa`, `mlp_speculator`": "yes" if {"medusa", "mlp_speculator"} <= set(methods) else "no",
        "rejection_sample_method values": ", ".join(caps["rejection_sample_methods"]) or "(no field)",
        "rejection `fly`": "yes" if "fly" in caps["rejection_sample_methods"] else "no",
        "draft_sample_method values": ", ".join(caps["draft_sample_methods"]) or "(no field)",
        "SpeculativeConfig fields (count)": str(len(caps["speculative_fields"])),
        "registered architectures (count)": str(len(caps["registered_architectures"])),
        "DFlash architectures registered": "<br>".join(archs) or "none",
        "attention backends (count)": str(len(caps["attention_backends"])),
        "`vllm serve` long options (count)": str(len(flags)),
        "`--enable-prefix-caching` negatable": "yes" if negatable else "no",
        "default model runner": caps["default_model_runner"] or "unknown",
        "capability script seconds": "n/a" if seconds is None else f"{seconds:.1f}",
        "keys not read (errors)": ", ".join(sorted(caps["errors"])) or "none",
    }


# What the preflight judges by name, compared release to release in the matrix's last section.
CHANGED_KEYS = (
    ("speculative methods", "speculative_methods"),
    ("rejection_sample_method values", "rejection_sample_methods"),
    ("draft_sample_method values", "draft_sample_methods"),
    ("SpeculativeConfig fields", "speculative_fields"),
    ("attention backends", "attention_backends"),
)


def changes(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    """What `after` accepts that `before` did not, and the reverse, one line per key that differs."""
    lines = []
    pairs = [*CHANGED_KEYS, ("DFlash architectures", None), ("`vllm serve` long options", "serve_flags")]
    for label, key in pairs:
        if key is None:
            old = {a for a in before["registered_architectures"] if any(p in a for p in DFLASH_FAMILY)}
            new = {a for a in after["registered_architectures"] if any(p in a for p in DFLASH_FAMILY)}
        else:
            old, new = set(before[key]), set(after[key])
        if old == new:
            continue
        added, removed = sorted(new - old), sorted(old - new)
        if key == "serve_flags":  # hundreds: counts, and the removed ones (a config using them breaks)
            text = f"{len(added)} added; removed: {', '.join(f'`{o}`' for o in removed) or 'none'}"
        else:
            text = "; ".join(
                part
                for part in (
                    "added " + ", ".join(f"`{a}`" for a in added) if added else "",
                    "removed " + ", ".join(f"`{r}`" for r in removed) if removed else "",
                )
                if part
            )
        lines.append(f"- {label}: {text}")
    if before["default_model_runner"] != after["default_model_runner"]:
        lines.append(f"- default model runner: {before['default_model_runner']} -> {after['default_model_runner']}")
    return lines


def render(results: Dict[str, Dict[str, Any]], probe_names: List[str], meta: Dict[str, str]) -> str:
    versions = list(results)
    head = "| | " + " | ".join(versions) + " |\n|---|" + "---|" * len(versions) + "\n"
    probe_rows = "".join(
        f"| `{name}` | " + " | ".join(results[v]["probes"].get(name, "n/a") for v in versions) + " |\n"
        for name in probe_names
    )
    rows: Dict[str, List[str]] = {}
    for version in versions:
        cells = results[version]["summary"]
        for row, value in cells.items():
            rows.setdefault(row, []).append(value)
    capability_rows = "".join(f"| {row} | " + " | ".join(values) + " |\n" for row, values in rows.items())
    change_sections = ""
    for before, after in zip(versions, versions[1:]):
        lines = changes(results[before]["capabilities"], results[after]["capabilities"])
        body = "\n".join(lines) or "- nothing the preflight judges"
        change_sections += f"\n### {before} -> {after}\n\n{body}\n"
    return f"""# vLLM compatibility matrix

Produced on {meta["date"]} by `make compat` (`tests/compat/run_compat.py`): for each release, the PyPI wheel
is unpacked (the probes read its files) and installed with its dependencies into a venv of its own (uv,
Python {meta["python"]}); the collection's capability script (`plugins/module_utils/_capability_script.py`)
then asks that vLLM what it accepts, on a host without a GPU ({meta["host"]}). The captured answers are
`tests/unit/data/capabilities/<version>.json`, which CI tests the preflight against. Regenerate after
changing a probe or the script: `make compat` (downloads ~10 GB per release the first time; cache in
`.cache/compat`, or `COMPAT_CACHE=DIR`).

## Probes

The regular expressions of `vllm_probes` (`roles/vllm/defaults/main.yml`), searched in the
release's own files as `vllm_facts` does: `yes` = found, `no` = not found, `no file` = the file does not
exist in that release.

{head}{probe_rows}
## Capabilities

What the installed vLLM answered (counts and the values the preflight judges most often). "DFlash
architectures" are the registered names containing `DFlash` or `LiLiCorr`. "default model runner" is the
one a config without a model gets when `VLLM_USE_V2_MODEL_RUNNER` is unset: `v1` where V2 is picked only
by rules on top of a V1 default (0.20: the variable alone; 0.22 to 0.28: some model architectures and
features, from 0.26 also mixed sliding/full DFlash drafters), `v2` where V2 is the default for everything
and V1 is left only for features V2 does not support (0.29 on, where mixed drafters are one of those
features V1 lacks). Whether a mixed drafter gets V2 by itself is the probe
`dflash_mixed_attention_auto_v2`. "capability script seconds" is this run's wall time, nearly all of it
vLLM's import, on a shared host (load average {meta["load"]} at the start). The first import after an
install is slower (Python compiles vLLM's bytecode, which uv skips at install unless
`--compile-bytecode`, and reads a cold disk): `vllm_facts` pays it once per release and caches the
answer.

{head}{capability_rows}
## Changes between releases

What each release accepts that the one before did not, and what it no longer accepts (a config that
uses a removed name fails at vLLM's startup; the preflight refuses it first).
{change_sections}"""


def load_probes() -> List[Dict[str, Any]]:
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    return list(defaults["vllm_probes"])


def pick_python() -> str:
    for name in ("python3.12", "python3.11"):
        for directory in ("/usr/bin", "/usr/local/bin"):
            candidate = Path(directory) / name
            if candidate.exists():
                return str(candidate)
    raise SystemExit("no python3.12 or python3.11 found. Fix: install one, or pass --python")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "compat")
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--python", default=None, help="interpreter of the release venvs (python3.12 or 3.11)")
    parser.add_argument("--no-fixtures", action="store_true", help="do not write tests/unit/data/capabilities")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    cache: Path = args.cache.resolve()
    python = args.python or pick_python()
    for sub in ("wheels", "src", "venvs"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    probes = load_probes()
    results: Dict[str, Dict[str, Any]] = {}
    load = f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs"
    for version in args.versions:
        package_dir = unpack(fetch_wheel(version, cache / "wheels"), cache / "src" / version)
        entry: Dict[str, Any] = {"probes": evaluate_probes(package_dir, probes)}
        venv_python = release_venv(version, cache, python)
        if venv_python is None:
            fixture = FIXTURES / f"{version}.json"
            if not fixture.exists():
                raise SystemExit(f"{version}: no venv and no captured {fixture}. Fix: free disk space")
            caps, seconds = json.loads(fixture.read_text()), None
        else:
            log(f"{version}: running the capability script")
            captured = capture(venv_python)
            caps, seconds = captured["capabilities"], captured["seconds"]
            log(f"{version}: {seconds:.1f} s, errors: {sorted(caps['errors']) or 'none'}")
            if caps["vllm_version"] != version:
                raise SystemExit(f"{venv_python} has vllm {caps['vllm_version']}, not {version}. Fix: rm -r its venv")
            if not args.no_fixtures:
                FIXTURES.mkdir(parents=True, exist_ok=True)
                (FIXTURES / f"{version}.json").write_text(json.dumps(caps, indent=1, sort_keys=True) + "\n")
        entry["summary"] = summary(caps, seconds)
        entry["capabilities"] = caps
        results[version] = entry
    version_of_python = [python, "-c", "import platform; print(platform.python_version())"]
    meta = {
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}",
        "python": run(version_of_python, capture_output=True).stdout.strip(),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load": load,
    }
    args.doc.write_text(render(results, [p["name"] for p in probes], meta))
    log(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
