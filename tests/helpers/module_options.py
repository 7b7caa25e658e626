"""The modules' options as Ansible sees them: the argument spec main() hands AnsibleModule, and the rendered docs."""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = ROOT / ".cache" / "ac"
MODULES = sorted(path.stem for path in (ROOT / "plugins" / "modules").glob("*.py") if path.stem != "__init__")
Spec = Dict[str, Dict[str, Any]]


class _Captured(Exception):
    pass


@functools.lru_cache(maxsize=None)
def argument_spec(name: str) -> Spec:
    """The argument_spec module `name` builds, whether a module constant or written inside main()."""
    module = importlib.import_module(f"ansible_collections.vllm_ops.dflash.plugins.modules.{name}")
    captured: Dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> None:
        captured.update(kwargs)
        raise _Captured

    real = module.AnsibleModule
    module.AnsibleModule = capture
    try:
        module.main()
    except _Captured:
        pass
    finally:
        module.AnsibleModule = real
    return captured["argument_spec"]


@functools.lru_cache(maxsize=None)
def rendered_docs() -> Dict[str, Dict[str, Any]]:
    """`ansible-doc -j` of every module, doc fragments merged in: module name -> its `doc`."""
    ansible_doc = Path(sys.executable).parent / "ansible-doc"
    names = [f"vllm_ops.dflash.{name}" for name in MODULES]
    proc = subprocess.run(
        [str(ansible_doc), "-t", "module", "-j", *names],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS)),
    )
    return {name.rsplit(".", 1)[1]: entry["doc"] for name, entry in json.loads(proc.stdout).items()}
