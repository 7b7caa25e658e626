# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Carry a second wheel of the same libraries as the few members that differ from a first one.

    python3 wheel_delta.py make BASE.whl TARGET.whl DELTA.zip    (the build host)
    python3 wheel_delta.py apply BASE.whl DELTA.zip OUTDIR       (the GPU host: writes OUTDIR/<TARGET's name>)

Two precompiled builds of vLLM from one base wheel share every library byte for byte (300 MB); they
differ in a few Python files and the .dist-info. The delta holds those members as stored (raw, still
compressed) and TARGET's member order; `apply` writes TARGET again by raw copies in that order and checks
its sha256 against TARGET's: the wheel on the GPU host is the one vllm_build built, byte for byte, or
`apply` fails. Test equipment of the proof on real hardware (tests/gpu); standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import zipfile
from typing import Callable, Dict, List, Tuple

_CHUNK = 1 << 20
_PLAN = "wheel-delta.json"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _key(info: zipfile.ZipInfo) -> Tuple[int, int, int, int]:
    return (info.CRC, info.compress_size, info.file_size, info.compress_type)


def _collection_copy_raw() -> Callable[[zipfile.ZipFile, zipfile.ZipInfo, zipfile.ZipFile], None]:
    """The collection's raw member copy (_wheel_overlay.copy_raw), imported from this checkout."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    top = tempfile.mkdtemp(prefix="wheel-delta-")
    os.makedirs(os.path.join(top, "ansible_collections", "vllm_ops"))
    os.symlink(repo, os.path.join(top, "ansible_collections", "vllm_ops", "dflash"))
    sys.path.insert(0, top)
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import copy_raw

    return copy_raw


def make(base: str, target: str, delta: str) -> Dict[str, object]:
    copy_raw = _collection_copy_raw()
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(target) as new:
        known = {info.filename: _key(info) for info in old.infolist()}
        changed: List[str] = [i.filename for i in new.infolist() if known.get(i.filename) != _key(i)]
        plan = {"target": os.path.basename(target), "sha256": _sha256(target), "base_sha256": _sha256(base),
                "order": [i.filename for i in new.infolist()], "changed": changed}  # fmt: skip
        with zipfile.ZipFile(delta, "w") as out:
            for name in changed:
                copy_raw(new, new.getinfo(name), out)
            out.writestr(_PLAN, json.dumps(plan, indent=1))
    return {"target": plan["target"], "changed": len(changed), "members": len(plan["order"]),
            "delta_bytes": os.path.getsize(delta)}  # fmt: skip


def apply(base: str, delta: str, outdir: str) -> Dict[str, object]:
    copy_raw = _collection_copy_raw()
    with zipfile.ZipFile(delta) as patch, zipfile.ZipFile(base) as old:
        plan = json.loads(patch.read(_PLAN))
        if _sha256(base) != plan["base_sha256"]:
            raise SystemExit(f"{base} is not the wheel the delta was made against (sha256 differs)")
        dest = os.path.join(outdir, plan["target"])
        tmp = dest + ".part"
        with zipfile.ZipFile(tmp, "w") as out:
            for name in plan["order"]:
                source = patch if name in plan["changed"] else old
                copy_raw(source, source.getinfo(name), out)
    actual = _sha256(tmp)
    if actual != plan["sha256"]:
        os.unlink(tmp)
        raise SystemExit(f"rebuilt {plan['target']} has sha256 {actual}, not the build host's {plan['sha256']}")
    os.replace(tmp, dest)
    return {"wheel": dest, "sha256": actual, "changed": len(plan["changed"])}


def main(argv: List[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("make", "apply"):
        print(__doc__, file=sys.stderr)
        return 2
    result = make(*argv[1:]) if argv[0] == "make" else apply(*argv[1:])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
