# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A venv whose `vllm` is the fixture engine's source tree, with distribution metadata of a given version.

The fixture engine answers the capability script like vLLM (its config, registry and `vllm serve` parser
live at vLLM's module paths), so facts gathered on this venv carry real capabilities without a build.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ENGINE_SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "engine"
YAML_SITE = Path(yaml.__file__).resolve().parents[1]  # the fixture engine imports PyYAML


def engine_venv(venv: Path, version: str = "0.33.0") -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "engine.pth").write_text(f"{ENGINE_SOURCE}\n{YAML_SITE}\n")
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return venv
