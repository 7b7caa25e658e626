"""Each module's rendered docs (doc fragments merged, as ansible-doc shows them) agree with its argument spec.

The defaults are written once in Python (module_utils/_args.py for the option families several modules share,
else the core's dataclass); the YAML of DOCUMENTATION and plugins/doc_fragments repeats them, so this is what
keeps the two the same (ansible-test's validate-modules checks it too, in the sanity lane only).
"""

from __future__ import annotations

from typing import Any, Dict

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.doc_fragments.common import ModuleDocFragment as Common
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _args
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate import GateSettings
from helpers.module_options import MODULES, argument_spec, rendered_docs

KEYS = ("type", "default", "choices", "elements", "required")


def _normal(key: str, value: Any, kind: str) -> Any:
    if key == "default" and value is not None and kind in ("float", "int"):
        return float(value)
    if key == "required":
        return bool(value)
    if key == "type":
        return value or "str"
    return value


def differences(documented: Dict[str, Any], spec: Dict[str, Any], where: str = "") -> list:
    found = [f"{where}{name}: documented, not in the argument spec" for name in sorted(set(documented) - set(spec))]
    found += [f"{where}{name}: in the argument spec, not documented" for name in sorted(set(spec) - set(documented))]
    for name in sorted(set(documented) & set(spec)):
        doc, arg = documented[name], spec[name]
        kind = arg.get("type", "str")
        for key in KEYS:
            if _normal(key, doc.get(key), kind) != _normal(key, arg.get(key), kind):
                found.append(f"{where}{name}: {key} documented {doc.get(key)!r}, argument spec {arg.get(key)!r}")
        found += differences(doc.get("suboptions") or {}, arg.get("options") or {}, f"{where}{name}.")
    return found


@pytest.mark.parametrize("name", MODULES)
def test_the_rendered_docs_are_the_argument_spec(name):
    assert differences(rendered_docs()[name]["options"], argument_spec(name)) == []


def test_a_default_the_docs_do_not_say_is_found():
    spec = {"root": dict(_args.ROOT_ARGS["root"], default="/srv/vllm"), "lease": {"type": "int"}}
    documented = {"root": {"type": "path", "default": "/opt/vllm"}, "lease": {"type": "int", "default": 3600}}
    assert differences(documented, spec) == [
        "lease: default documented 3600, argument spec None",
        "root: default documented '/opt/vllm', argument spec '/srv/vllm'",
    ]


@pytest.mark.parametrize(
    ("fragment", "spec"),
    [
        (Common.DOCUMENTATION, _args.ROOT_ARGS),
        (Common.INSTANCE, _args.INSTANCE_ARGS),
        (Common.INSTALLER, _args.INSTALLER_ARGS),
        (Common.KEEP_RELEASES, _args.KEEP_RELEASES_ARGS),
        (Common.DISK_BUDGET, _args.DISK_BUDGET_ARGS),
    ],
    ids=["root", "instance", "installer", "keep_releases", "disk_budget"],
)
def test_each_common_fragment_documents_its_family(fragment, spec):
    assert differences(yaml.safe_load(fragment)["options"], spec) == []


def test_every_module_with_a_family_option_takes_the_familys_spec():
    """A module that has root (or python, installer, ...) has the family's own spec, not a copy that may drift."""
    families = {
        **_args.ROOT_ARGS,
        **_args.INSTANCE_ARGS,
        **_args.INSTALLER_ARGS,
        **_args.KEEP_RELEASES_ARGS,
        **_args.DISK_BUDGET_ARGS,
    }
    exceptions = {("model_stage", "python")}  # the interpreter that downloads, not one that makes a venv
    for name in MODULES:
        for option, spec in argument_spec(name).items():
            if option in families and (name, option) not in exceptions:
                assert spec is families[option], f"{name}: option {option} is not module_utils/_args.py's"


def test_the_gate_says_the_sizes_it_falls_back_to():
    """requests, max_tokens and concurrency have no spec default (a workload's apply); the text names GateSettings'."""
    options = rendered_docs()["acceptance_gate"]["options"]
    for name in ("requests", "max_tokens", "concurrency"):
        text = options[name]["description"]
        text = text if isinstance(text, str) else " ".join(text)
        assert f"Default {getattr(GateSettings(), name)}," in text, name
