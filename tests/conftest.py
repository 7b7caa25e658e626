"""Make this checkout importable as ansible_collections.vllm_ops.dflash for the unit tests."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / ".cache" / "ac"
_link = COLLECTIONS / "ansible_collections" / "vllm_ops" / "dflash"
if not _link.exists():
    _link.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # another pytest worker made it first
        os.symlink(ROOT, _link)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
