# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of vllm_build: one argument spec, the typed options built from it, and their checks.

BUILD_ARGUMENT_SPEC is the only place a default is written: BuildOptions fills what it is not given
from it, and the doc fragment `vllm_ops.dflash.build` renders its `default:` lines from it.
Options are checked here before anything is read or written on the host (bad input changes nothing).
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Set

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
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
    "VLLM_BUILD_ARGUMENT_SPEC",
    "BuildError",
    "BuildOptions",
    "OptionError",
    "build_options",
    "option_secrets",
    "recorded_build_env",
    "recorded_pip_args",
    "secret_name",
    "validate",
]

INSTALLERS = ("auto", "uv", "pip")
MASK = "********"
# A build_env name that says it holds a credential (HF_TOKEN, WANDB_APIKEY, DB_PASS, MY_CREDENTIALS,
# hf-token ...): its value is used for the build but never recorded, logged or returned.
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
_HEX = re.compile(r"[0-9a-f]{4,40}")

# The options that name a release (doc fragment vllm_ops.dflash.build): vllm_build's and vllm_drift's.
BUILD_ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = {
    "repo": {"type": "str", "required": True},
    "ref": {"type": "str", "required": True},
    "expected_commit": {"type": "str"},
    "root": {"type": "path", "default": "/opt/vllm"},
    "python": {"type": "str", "default": "python3"},
    "installer": {"type": "str", "choices": list(INSTALLERS), "default": "auto"},
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
    "wheel_sha256": {"type": "str"},
}

# vllm_build's own options besides those (documented in the module).
VLLM_BUILD_ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = {
    "keep_releases": {"type": "int", "default": 3},
    "run_id": {"type": "str"},
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
    wheel_sha256: Optional[str]
    keep_releases: int
    run_id: Optional[str]

    def __init__(self, repo: str, ref: str, **options: Any) -> None:
        specs = {**BUILD_ARGUMENT_SPEC, **VLLM_BUILD_ARGUMENT_SPEC}
        unknown = sorted(set(options) - set(specs))
        if unknown:
            raise TypeError(f"BuildOptions got unknown options: {', '.join(unknown)}")
        values: Dict[str, Any] = {name: copy.deepcopy(spec.get("default")) for name, spec in specs.items()}
        values.update((name, value) for name, value in options.items() if value is not None)
        for name, value in values.items():
            setattr(self, name, value)
        self.repo = repo
        self.ref = ref
        self.root = os.path.abspath(values["root"])
        self.build_env = {str(k): str(v) for k, v in (values["build_env"] or {}).items()}
        self.build_timeout = float(values["build_timeout"])
        self.keep_releases = int(values["keep_releases"])
        self.build_isolation = bool(values["build_isolation"])
        self.system_site_packages = bool(values["system_site_packages"])
        self.pip_args = [str(a) for a in (values["pip_args"] or [])]
        expected = values["expected_commit"]
        self.expected_commit = str(expected).strip().lower() if expected else None
        self.precompiled_wheel = values["precompiled_wheel"] or None


def build_options(params: Mapping[str, Any], **extra: Any) -> BuildOptions:
    """BuildOptions from a module's validated BUILD_ARGUMENT_SPEC parameters (plus `extra` keywords)."""
    given = {name: params[name] for name in BUILD_ARGUMENT_SPEC if name not in ("repo", "ref")}
    return BuildOptions(params["repo"], params["ref"], **given, **extra)


def secret_name(name: str) -> bool:
    """Whether a build_env name says its value is a credential."""
    return bool(_SECRET_NAME.search(name))


def _url_secret(text: str) -> Optional[str]:
    """The password (or token given as user name) of the first URL in `text` that carries one."""
    if redact_url(text) == text:
        return None
    userinfo = text.split("://", 1)[1].split("@", 1)[0]
    return (userinfo.split(":", 1)[1] if ":" in userinfo else userinfo) or None


def option_secrets(params: Mapping[str, Any]) -> Set[str]:
    """The secrets among the options, for Ansible to mask (`no_log_values`): credentials in URLs (repo,
    precompiled_base, precompiled_wheel, pip_args, build_env values) and secret-named build_env values."""
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
        raise OptionError("ref is empty. Fix: give a branch, tag, commit SHA or refs/... name")
    bad = [char for char in ref if ord(char) < 32 or ord(char) == 127]
    if bad or ref != ref.strip():
        what = "a control character (NUL, newline, tab ...)" if bad else "leading or trailing spaces"
        raise OptionError(
            f"ref {ref!r} contains {what}, which no git ref has. Fix: give the ref alone "
            "(a YAML block scalar adds a newline: use `|-` / `>-`, or quote the value)"
        )


def validate(opts: BuildOptions) -> None:
    """Refuse options that cannot be honoured, before anything is read or written on the host."""
    _check_ref(opts.ref)
    if opts.expected_commit is not None and not _HEX.fullmatch(opts.expected_commit):
        raise OptionError(
            f"expected_commit {opts.expected_commit!r} is not a commit SHA or a prefix of one (4 to 40 hex digits). "
            "Fix: give the reviewed commit, e.g. the first 12 hex digits"
        )
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
