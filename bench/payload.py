# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a module's payload costs, side by side for two versions of the collection (issue 30; bench/README.md).

The controller: AnsiballZ builds a module's payload once per run (its cache lives in the run's local tmp): it
scans the module and every core its imports reach, and zips them. Measured here as ansible-playbook's worker
does it, `modify_module` in a fresh process, CPU time of that call alone, for `ansible.builtin.ping` (the floor)
and each module named. The host: the module's python imports its cores from the zip, compiling each (no
bytecode there); measured as the CPU of importing the module's core in a fresh python without bytecode.

Each measurement is its own process; the versions alternate, ROUNDS times; medians are printed.

    .venv/bin/python bench/payload.py [--base main] [--rounds 7] [--module vllm_drift:_drift]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]

# Runs in the child: the payload of one module, as the worker builds it (collection metadata loaded first).
_BUILD = r"""
import importlib, json, os, sys, time
from ansible import constants as C
from ansible.executor.module_common import modify_module
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader, module_loader
from ansible.template import Templar

init_plugin_loader([os.environ["ANSIBLE_COLLECTIONS_PATH"]])
name = sys.argv[1]
path = module_loader.find_plugin_with_context(name).plugin_resolved_path
templar = Templar(loader=DataLoader())
if name.startswith("vllm_ops."):
    importlib.import_module("ansible_collections.vllm_ops.dflash.plugins.module_utils")
start = time.process_time()
built = modify_module(module_name=name, module_path=path, module_args={}, templar=templar,
                      task_vars={"ansible_python_interpreter": sys.executable},
                      module_compression=C.DEFAULT_MODULE_COMPRESSION)
print(json.dumps({"cpu": time.process_time() - start, "bytes": len(built.b_module_data)}))
"""

# Runs in the child: importing the module's core without bytecode, as the host does from the zip.
_IMPORT = r"""
import importlib, json, sys, time
start = time.process_time()
importlib.import_module("ansible_collections.vllm_ops.dflash.plugins.module_utils." + sys.argv[1])
cores = [m for m in sys.modules if ".dflash.plugins.module_utils._" in m]
print(json.dumps({"cpu": time.process_time() - start, "cores": len(cores)}))
"""


def _tree(rev: str, into: Path) -> Path:
    """A collection path holding `rev` of this checkout (`.`: the working tree as it is)."""
    target = into / "ansible_collections" / "vllm_ops" / "dflash"
    target.parent.mkdir(parents=True)
    if rev == ".":
        target.symlink_to(ROOT)
    else:
        target.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return into


def _child(code: str, path: Path, arg: str) -> Dict[str, float]:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(path), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPYCACHEPREFIX", None)
    out = subprocess.run(
        [sys.executable, "-B", "-c", code, arg], env=env, cwd=path, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the version to compare with the working tree")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--module", action="append", default=None, help="module:core, e.g. vllm_drift:_drift")
    args = parser.parse_args()
    modules = [item.split(":") for item in args.module or ["vllm_drift:_drift"]]
    with tempfile.TemporaryDirectory(prefix="payload-") as tmp:
        trees = {args.base: _tree(args.base, Path(tmp) / "base"), "working tree": _tree(".", Path(tmp) / "work")}
        figures: Dict[str, List[Dict[str, float]]] = {}
        for round_ in range(args.rounds):
            order = list(trees.items()) if round_ % 2 == 0 else list(reversed(trees.items()))
            for label, path in order:
                figures.setdefault(f"{label}|ansible.builtin.ping|build", []).append(
                    _child(_BUILD, path, "ansible.builtin.ping")
                )
                for module, core in modules:
                    fqcn = f"vllm_ops.dflash.{module}"
                    figures.setdefault(f"{label}|{fqcn}|build", []).append(_child(_BUILD, path, fqcn))
                    figures.setdefault(f"{label}|{fqcn}|import", []).append(_child(_IMPORT, path, core))
    for key, runs in figures.items():
        label, module, what = key.split("|")
        cpu = [run["cpu"] for run in runs]
        size = runs[-1].get("bytes", runs[-1].get("cores"))
        unit = "bytes" if what == "build" else "cores"
        shown = ", ".join(f"{value:.3f}" for value in cpu)
        print(f"{label:>14} {module:28} {what:6} median {statistics.median(cpu):.3f} s ({shown}); {size:.0f} {unit}")


if __name__ == "__main__":
    main()
