# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an installed vLLM can do, asked of vLLM itself (capabilities, schema 1).

`CAPABILITY_SCRIPT` runs in the release venv's own python (`capability_command`): it imports vLLM's
config, registry and `vllm serve` parser, reads the speculative methods, sample methods, speculative
config fields, registered architectures, attention backends, serve flags and the default model runner,
and prints one result line `<mark> <json>`. Each key is read on its own: one that a release lacks is
left empty and explained in `errors`, the others are still filled. No GPU is needed; vLLM's import
takes a minute or more on a small host, so callers cache the result per release.

A key that could not be read holds its empty value ([], {} or null) and its reason in `errors`.
`serve_flags` lists every long option string the parser accepts, also those hidden from `--help` (0.33
shows `--disable-x` for `--no-enable-x`, which still parses); `negatable` marks an
`argparse.BooleanOptionalAction`, and a false is spelled `--no-<flag>` only where that string is listed.
`default_model_runner` is what `VllmConfig()` without a model picks with `VLLM_USE_V2_MODEL_RUNNER` unset
on a host with Triton: `v1` on 0.20 to 0.28 (V2 there only by per-model or per-feature rules), `v2` from
0.29 on.

Stray output cannot break or forge the result: while vLLM is imported, file descriptor 1 points at
stderr (vLLM logs to stdout), and only the line that starts with this run's random mark counts.

Standard library only: this module is imported on the target host's system Python (3.8+).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional

__all__ = [
    "CAPABILITY_KEYS",
    "CAPABILITY_SCHEMA",
    "CAPABILITY_SCRIPT",
    "CapabilityError",
    "capability_command",
    "check_capabilities",
    "new_mark",
    "parse_capability_output",
]

CAPABILITY_SCHEMA = 1
_LIST_KEYS = (
    "speculative_methods",
    "mtp_aliases",
    "rejection_sample_methods",
    "draft_sample_methods",
    "speculative_fields",
    "registered_architectures",
    "attention_backends",
)
# Every key the script reads (and so may name in `errors`), in the order it reads them.
CAPABILITY_KEYS = ("vllm_version", *_LIST_KEYS, "serve_flags", "default_model_runner")
_TOP_KEYS = frozenset(("schema", *CAPABILITY_KEYS, "errors"))
_FLAG_KEYS = {"dest": str, "takes_value": bool, "negatable": bool}
_RUNNERS = ("v1", "v2")
_ERROR_LIMIT = 500

# Runs in the release venv (`python -I -c CAPABILITY_SCRIPT <mark>`): vLLM's python, 3.8+ syntax kept so
# that the unit test can parse it with feature_version 3.8 like the module around it.
CAPABILITY_SCRIPT = r'''
import os
import shutil
import sys
import tempfile

MARK = sys.argv[1] if len(sys.argv) > 1 else "@@vllm_capabilities@@"
ERROR_LIMIT = 500

# vLLM logs to stdout: keep fd 1 (and sys.stdout) on stderr until the result line is written.
_result_fd = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr

# No network, no telemetry, quiet logs, caches in a directory removed at the end, no GPU touched (a GPU
# host may be serving: no CUDA context, and the same answer as a CPU host); the default model runner is
# the one chosen when VLLM_USE_V2_MODEL_RUNNER is unset.
_scratch = tempfile.mkdtemp(prefix="vllm-capabilities-")
os.environ.update({
    "VLLM_LOGGING_LEVEL": "ERROR",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
    "XDG_CACHE_HOME": os.path.join(_scratch, "cache"),
    "VLLM_CACHE_ROOT": os.path.join(_scratch, "vllm-cache"),
    "VLLM_CONFIG_ROOT": os.path.join(_scratch, "vllm-config"),
    "TRITON_CACHE_DIR": os.path.join(_scratch, "triton"),
    "TORCHINDUCTOR_CACHE_DIR": os.path.join(_scratch, "inductor"),
})
os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)

import argparse
import dataclasses
import importlib
import json
import typing


def error_text(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= ERROR_LIMIT else text[:ERROR_LIMIT] + "..."


def first_attribute(candidates):
    """The first `module:attribute` that imports; the error of each when none does."""
    failures = []
    for candidate in candidates:
        module_name, attribute = candidate.split(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except Exception as exc:
            failures.append("%s (%s)" % (candidate, error_text(exc)))
    raise LookupError("none of " + "; ".join(failures))


def literal_values(annotation):
    """The strings of a Literal, nested Literals and Optional/Union/Annotated unfolded, in order."""
    values = []
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        for arg in typing.get_args(annotation):
            if isinstance(arg, str):
                values.append(arg)
            else:
                values.extend(literal_values(arg))
    elif origin is not None:
        args = typing.get_args(annotation)
        if origin is getattr(typing, "Annotated", None):
            args = args[:1]
        for arg in args:  # Optional[...], Union[...] and `X | None` (origin types.UnionType)
            values.extend(literal_values(arg))
    seen = set()
    return [v for v in values if not (v in seen or seen.add(v))]


def speculative_config_class():
    return first_attribute(["vllm.config.speculative:SpeculativeConfig", "vllm.config:SpeculativeConfig"])


def field_annotation(cls, name):
    """The resolved type of field `name` of a (pydantic) dataclass, or None when there is no such field."""
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if name not in fields:
        model_fields = getattr(cls, "model_fields", None) or {}
        if name in model_fields:
            return model_fields[name].annotation
        return None
    annotation = fields[name].type
    if isinstance(annotation, str):
        module = sys.modules.get(cls.__module__)
        annotation = eval(annotation, dict(vars(module)) if module else {})
    return annotation


def read_speculative_methods():
    module = importlib.import_module(speculative_config_class().__module__)
    return literal_values(getattr(module, "SpeculativeMethod"))


def read_mtp_aliases():
    module = importlib.import_module(speculative_config_class().__module__)
    mtp_types = getattr(module, "MTPModelTypes", None)
    return [] if mtp_types is None else [name for name in literal_values(mtp_types) if name != "mtp"]


def read_field_literal(name):
    annotation = field_annotation(speculative_config_class(), name)
    return [] if annotation is None else literal_values(annotation)


def read_speculative_fields():
    cls = speculative_config_class()
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict):
        return list(model_fields)
    raise TypeError("%s is neither a dataclass nor a pydantic model" % cls.__name__)


def read_registered_architectures():
    registry = first_attribute(["vllm.model_executor.models.registry:ModelRegistry",
                                "vllm.model_executor.models:ModelRegistry", "vllm:ModelRegistry"])
    return sorted(str(name) for name in registry.get_supported_archs())


def read_attention_backends():
    enum = first_attribute(["vllm.v1.attention.backends.registry:AttentionBackendEnum",
                            "vllm.attention.backends.registry:AttentionBackendEnum",
                            "vllm.attention.backends.registry:_Backend",
                            "vllm.platforms.interface:_Backend"])
    return [str(name) for name in enum.__members__]


def pretend_gpu_device():
    """A CPU-only host has no platform, and vLLM's DeviceConfig refuses device 'auto' without one: give
    the unspecified platform the device type of the GPU hosts this is asked for (nothing runs on it)."""
    try:
        from vllm.platforms import current_platform
        if not getattr(current_platform, "device_type", "x"):
            current_platform.device_type = "cuda"
    except Exception:
        pass


def json_value(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def read_serve_flags():
    pretend_gpu_device()
    parser_class = first_attribute(["vllm.utils.argparse_utils:FlexibleArgumentParser",
                                    "vllm.utils:FlexibleArgumentParser"])
    make_arg_parser = first_attribute(["vllm.entrypoints.common.cli_args:make_arg_parser",
                                       "vllm.entrypoints.launchers.cli_args:make_arg_parser",
                                       "vllm.entrypoints.openai.cli_args:make_arg_parser",
                                       "vllm.entrypoints.cli.serve:make_arg_parser"])
    parser = make_arg_parser(parser_class())
    boolean_optional = getattr(argparse, "BooleanOptionalAction", ())
    flags = {}
    # Every option string the parser accepts: 0.33 hides `--no-enable-x` from action.option_strings
    # (help shows `--disable-x`) but still parses it.
    for option, action in parser._option_string_actions.items():
        if not option.startswith("--"):
            continue
        choices = None
        if action.choices is not None:
            choices = [json_value(choice) for choice in list(action.choices)]
        flags[option] = {
            "dest": str(action.dest),
            "takes_value": action.nargs != 0,
            "choices": choices,
            "negatable": bool(boolean_optional) and isinstance(action, boolean_optional),
        }
    return dict(sorted(flags.items()))


def default_config(cls):
    """The config vLLM builds with no model: VllmConfig() when it constructs here, else its field
    defaults without the cross-config checks of __post_init__ (which may need a GPU)."""
    try:
        return cls()
    except Exception:
        if not dataclasses.is_dataclass(cls):
            raise
    config = object.__new__(cls)
    for item in dataclasses.fields(cls):
        value = None
        try:
            if item.default_factory is not dataclasses.MISSING:
                value = item.default_factory()
            elif item.default is not dataclasses.MISSING:
                value = item.default
        except Exception:
            pass
        object.__setattr__(config, item.name, value)
    return config


def read_default_model_runner():
    pretend_gpu_device()
    config_module = importlib.import_module("vllm.config.vllm")
    cls = getattr(config_module, "VllmConfig")
    if not isinstance(getattr(cls, "use_v2_model_runner", None), property):
        # Before the property (0.20): the environment variable alone, False when unset.
        envs = importlib.import_module("vllm.envs")
        return "v2" if getattr(envs, "VLLM_USE_V2_MODEL_RUNNER") else "v1"
    if getattr(config_module, "HAS_TRITON", True) is False:
        config_module.HAS_TRITON = True  # vLLM's GPU wheels bring Triton; a CPU host has no driver for it
    return "v2" if cls.use_v2_model_runner.fget(default_config(cls)) else "v1"


def read_vllm_version():
    try:
        from importlib import metadata
        return metadata.version("vllm")
    except Exception:
        return str(importlib.import_module("vllm").__version__)


READERS = [
    ("vllm_version", read_vllm_version, None),
    ("speculative_methods", read_speculative_methods, []),
    ("mtp_aliases", read_mtp_aliases, []),
    ("rejection_sample_methods", lambda: read_field_literal("rejection_sample_method"), []),
    ("draft_sample_methods", lambda: read_field_literal("draft_sample_method"), []),
    ("speculative_fields", read_speculative_fields, []),
    ("registered_architectures", read_registered_architectures, []),
    ("attention_backends", read_attention_backends, []),
    ("serve_flags", read_serve_flags, {}),
    ("default_model_runner", read_default_model_runner, None),
]


def main():
    result = {"schema": 1}
    errors = {}
    for key, reader, empty in READERS:
        try:
            result[key] = reader()
        except (Exception, SystemExit) as exc:
            result[key] = empty
            errors[key] = error_text(exc)
    result["errors"] = errors
    line = "\n" + MARK + " " + json.dumps(result, sort_keys=True) + "\n"
    sys.stderr.flush()
    with os.fdopen(_result_fd, "w") as out:
        out.write(line)


try:
    main()
finally:
    shutil.rmtree(_scratch, ignore_errors=True)
'''


class CapabilityError(ValueError):
    """The capability script gave no usable answer; the message names the cause and the fix."""


def new_mark() -> str:
    """A mark for one run: output that does not start with it is never taken for the result."""
    return f"@@vllm_capabilities:{uuid.uuid4().hex}@@"


def capability_command(python: str, mark: str) -> List[str]:
    """argv that runs the script in `python` (a release venv's); `-I` keeps cwd and PYTHON* out of it."""
    return [python, "-I", "-c", CAPABILITY_SCRIPT, mark]


def _problems(obj: Any) -> List[str]:
    if not isinstance(obj, dict):
        return [f"the result is a {type(obj).__name__}, not a JSON object"]
    problems: List[str] = []
    missing = sorted(_TOP_KEYS - set(obj))
    unknown = sorted(set(obj) - _TOP_KEYS)
    if missing:
        problems.append("missing keys " + ", ".join(missing))
    if unknown:
        problems.append("unknown keys " + ", ".join(unknown))
    if obj.get("schema") != CAPABILITY_SCHEMA:
        problems.append(f"schema is {obj.get('schema')!r}, this collection reads schema {CAPABILITY_SCHEMA}")
    version = obj.get("vllm_version")
    if version is not None and not isinstance(version, str):
        problems.append("vllm_version must be a string or null")
    for key in _LIST_KEYS:
        value = obj.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            problems.append(f"{key} must be a list of strings")
    flags = obj.get("serve_flags", {})
    if not isinstance(flags, dict):
        problems.append("serve_flags must be a mapping of option string to flag")
    else:
        for option, flag in flags.items():
            if not option.startswith("--") or not isinstance(flag, dict):
                problems.append(f"serve_flags[{option!r}] must be a long option mapped to a flag")
                continue
            wrong = [k for k, t in _FLAG_KEYS.items() if not isinstance(flag.get(k), t)]
            choices = flag.get("choices")
            if choices is not None and not isinstance(choices, list):
                wrong.append("choices")
            if set(flag) != {*_FLAG_KEYS, "choices"} or wrong:
                problems.append(
                    f"serve_flags[{option!r}] must have exactly dest (str), takes_value (bool), "
                    f"choices (list or null), negatable (bool)"
                )
                break
    if obj.get("default_model_runner") not in (*_RUNNERS, None):
        problems.append("default_model_runner must be 'v1', 'v2' or null")
    errors = obj.get("errors", {})
    if not isinstance(errors, dict) or not all(isinstance(v, str) for v in errors.values()):
        problems.append("errors must be a mapping of key to error text")
    elif set(errors) - set(CAPABILITY_KEYS):
        problems.append(
            "errors names keys that are not capabilities: " + ", ".join(sorted(set(errors) - set(CAPABILITY_KEYS)))
        )
    return problems


def check_capabilities(obj: Any, source: str = "the capability object") -> Dict[str, Any]:
    """`obj` when it follows schema 1 (keys and types), else CapabilityError naming what is wrong."""
    problems = _problems(obj)
    if problems:
        raise CapabilityError(
            f"{source} does not follow capabilities schema {CAPABILITY_SCHEMA}: {'; '.join(problems)}. "
            "Fix: delete it so that vllm_facts asks the installed vLLM again"
        )
    return obj


def parse_capability_output(stdout: str, mark: str) -> Dict[str, Any]:
    """The capabilities in the script's stdout: the last line that starts with `mark`, checked."""
    result: Optional[str] = None
    for line in stdout.splitlines():
        if line.startswith(mark + " "):
            result = line[len(mark) + 1 :]
    if result is None:
        raise CapabilityError(
            "the capability script printed no result line: it failed or was killed before the end "
            "(its stderr says why). Fix: check that the release venv's python can `import vllm`, "
            "or raise the timeout"
        )
    try:
        obj = json.loads(result)
    except ValueError as exc:
        raise CapabilityError(
            f"the capability script's result line is not JSON ({exc}). "
            "Fix: report it; rerun vllm_facts to ask the installed vLLM again"
        ) from exc
    return check_capabilities(obj, "the capability script's result")
