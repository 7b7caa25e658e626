"""The capability script, run for real in a python of its own: on the fixture engine, on fake vLLM
packages shaped like each release family (0.20, 0.26, 0.33), and on broken ones; and its parser."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _capability_script as cap

CHECKOUT = Path(__file__).resolve().parents[4]
ENGINE_SOURCE = CHECKOUT / "tests" / "fixtures" / "engine"
YAML_SITE = Path(yaml.__file__).resolve().parents[1]  # the fixture engine imports PyYAML


def make_venv(tmp_path: Path, *paths: Path) -> str:
    """A venv without pip whose site-packages .pth puts `paths` on sys.path (which -I keeps)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "packages.pth").write_text("".join(f"{path}\n" for path in paths))
    return str(venv / "bin" / "python")


def write_package(root: Path, files: Dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def run_script(python: str, env: Optional[Dict[str, str]] = None) -> Tuple[subprocess.CompletedProcess, str]:
    """(the finished process, this run's mark)."""
    mark = cap.new_mark()
    result = subprocess.run(
        cap.capability_command(python, mark),
        capture_output=True,
        text=True,
        cwd="/",
        env=dict(os.environ, **(env or {})),
        timeout=300,
        check=False,
    )
    return result, mark


def capabilities(python: str, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    result, mark = run_script(python, env)
    assert result.returncode == 0, result.stderr
    return cap.parse_capability_output(result.stdout, mark)


# --- fake vLLM packages, one per shape of the releases ------------------------------------------------
COMMON = {
    "vllm/__init__.py": "__version__ = '{version}'\n",
    "vllm/config/__init__.py": "",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/registry.py": """
        class _ModelRegistry:
            def get_supported_archs(self):
                return {archs!r}
        ModelRegistry = _ModelRegistry()
    """,
    "vllm/entrypoints/__init__.py": "",
}

# 0.20: no draft_sample_method, `strict` sampling, no use_v2_model_runner (the variable alone decides),
# FlexibleArgumentParser in vllm.utils, the attention enum `_Backend` in vllm.platforms.interface.
SHAPE_0_20 = {
    "vllm/config/speculative.py": """
        from dataclasses import dataclass
        from typing import Literal, Optional
        MTPModelTypes = Literal["deepseek_mtp", "mtp"]
        EagleModelTypes = Literal["eagle", MTPModelTypes]
        SpeculativeMethod = Literal["ngram", "medusa", EagleModelTypes]
        RejectionSampleMethod = Literal["strict", "probabilistic", "synthetic"]

        @dataclass
        class SpeculativeConfig:
            model: Optional[str] = None
            method: Optional[SpeculativeMethod] = None
            rejection_sample_method: RejectionSampleMethod = "strict"
    """,
    "vllm/config/vllm.py": "class VllmConfig:\n    pass\n",
    "vllm/envs.py": """
        import os
        def __getattr__(name):
            if name == "VLLM_USE_V2_MODEL_RUNNER":
                return bool(int(os.getenv(name, "0")))
            raise AttributeError(name)
    """,
    "vllm/utils/__init__.py": "import argparse\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n",
    "vllm/platforms/__init__.py": "",
    "vllm/platforms/interface.py": "import enum\nclass _Backend(enum.Enum):\n    FLASH_ATTN = 1\n    XFORMERS = 2\n",
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/cli_args.py": """
        def make_arg_parser(parser):
            parser.add_argument("model_tag", nargs="?")
            parser.add_argument("--port", type=int, default=8000)
            parser.add_argument("--disable-log-requests", action="store_true")
            return parser
    """,
}

# 0.26: pydantic-like dataclass with a V2 runner property that depends on the model (none -> V1) and
# on VLLM_USE_V2_MODEL_RUNNER, vllm.utils.argparse_utils, the enum in v1/attention/backends/registry.py.
SHAPE_0_26 = {
    "vllm/config/speculative.py": """
        from dataclasses import dataclass, field
        from typing import Literal, Optional
        MTPModelTypes = Literal["deepseek_mtp", "qwen3_5_mtp", "mtp"]
        DFlashModelTypes = Literal["dflash"]
        EagleModelTypes = Literal["eagle", "eagle3", MTPModelTypes, DFlashModelTypes]
        SpeculativeMethod = Literal["ngram", "medusa", "mlp_speculator", EagleModelTypes, "dspark"]
        RejectionSampleMethod = Literal["standard", "synthetic", "block"]
        DraftSampleMethod = Literal["greedy", "probabilistic"]

        @dataclass
        class SpeculativeConfig:
            num_speculative_tokens: Optional[int] = None
            model: Optional[str] = None
            method: Optional[SpeculativeMethod] = None
            rejection_sample_method: RejectionSampleMethod = "standard"
            draft_sample_method: DraftSampleMethod = "greedy"
            cached: int = field(default=0, init=False)
    """,
    "vllm/envs.py": """
        import os
        def __getattr__(name):
            if name == "VLLM_USE_V2_MODEL_RUNNER":
                value = os.getenv(name)
                return None if value is None else bool(int(value))
            raise AttributeError(name)
    """,
    "vllm/config/vllm.py": """
        from dataclasses import dataclass
        from typing import Any
        from vllm import envs

        @dataclass
        class VllmConfig:
            model_config: Any = None

            @property
            def use_v2_model_runner(self):
                if envs.VLLM_USE_V2_MODEL_RUNNER is not None:
                    return envs.VLLM_USE_V2_MODEL_RUNNER
                return self.model_config is not None
    """,
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "import argparse\nclass FlexibleArgumentParser(argparse.ArgumentParser): ...\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/backends/__init__.py": "",
    "vllm/v1/attention/backends/registry.py": """
        import enum
        class AttentionBackendEnum(enum.Enum):
            FLASH_ATTN = "a"
            TRITON_ATTN = "b"
            FLEX_ATTENTION = "c"
    """,
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/cli_args.py": """
        import argparse
        def make_arg_parser(parser):
            parser.add_argument("model_tag", nargs="?")
            parser.add_argument("--port", type=int, default=8000)
            parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
            parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
            parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
            return parser
    """,
}

# 0.33: `from __future__ import annotations` (string annotations), VllmConfig() refuses to build without a
# device (the field defaults are used), V2 unless Triton is missing (a CPU host), the parser in
# vllm.entrypoints.common.cli_args.
SHAPE_0_33 = dict(
    SHAPE_0_26,
    **{
        "vllm/config/speculative.py": """
            from __future__ import annotations
            from dataclasses import dataclass
            from typing import Literal, Optional
            MTPModelTypes = Literal["deepseek_mtp", "mtp", "gemma4_mtp"]
            SpeculativeMethod = Literal["ngram", "draft_model", "eagle", MTPModelTypes, "dflash", "dspark"]
            RejectionSampleMethod = Literal["standard", "synthetic", "block", "fly"]
            DraftSampleMethod = Literal["greedy", "probabilistic"]

            @dataclass
            class SpeculativeConfig:
                method: Optional[SpeculativeMethod] = None
                rejection_sample_method: RejectionSampleMethod = "standard"
                draft_sample_method: Optional[DraftSampleMethod] = "greedy"
                fly_window_size: Optional[int] = None
        """,
        "vllm/config/vllm.py": """
            from dataclasses import dataclass, field
            from typing import Any, List
            from vllm import envs
            HAS_TRITON = False

            @dataclass
            class VllmConfig:
                model_config: Any = None
                unsupported: List[str] = field(default_factory=list)

                def __post_init__(self):
                    raise RuntimeError("Failed to infer device type")

                @property
                def use_v2_model_runner(self):
                    if envs.VLLM_USE_V2_MODEL_RUNNER is not None:
                        return envs.VLLM_USE_V2_MODEL_RUNNER
                    if not HAS_TRITON:
                        return False
                    return not self.unsupported
        """,
        "vllm/entrypoints/openai/cli_args.py": "raise ImportError('moved to vllm.entrypoints.common.cli_args')\n",
        "vllm/entrypoints/common/__init__.py": "",
        "vllm/entrypoints/common/cli_args.py": """
            import argparse

            class EnableDisableAction(argparse.BooleanOptionalAction):
                # vLLM 0.33's: --enable-x pairs with --disable-x; --no-enable-x parses but is hidden.
                def __init__(self, option_strings, dest, *args, **kwargs):
                    super().__init__(option_strings, dest, *args, **kwargs)
                    inverse = "--disable-" + option_strings[0][len("--enable-"):]
                    self.visible_option_strings = [*option_strings, inverse]
                    self.option_strings = [*self.option_strings, inverse]

            def make_arg_parser(parser):
                parser.add_argument("--port", type=int, default=8000)
                parser.add_argument("--attention-backend", default=None)
                action = parser.add_argument("--enable-prefix-caching", action=EnableDisableAction)
                action.option_strings = action.visible_option_strings  # registered, then hidden from help
                return parser
        """,
    },
)


def fake_vllm(tmp_path: Path, shape: Dict[str, str], version: str, archs: Any) -> str:
    files = {
        path: text.replace("{version}", version).replace("{archs!r}", repr(archs)) for path, text in COMMON.items()
    }
    files.update(shape)
    root = write_package(tmp_path / "pkg", files)
    return make_venv(tmp_path, root)


# --- the fixture engine -----------------------------------------------------------------------------
def test_the_fixture_engine_answers_like_vllm(tmp_path: Path) -> None:
    python = make_venv(tmp_path, ENGINE_SOURCE, YAML_SITE)
    caps = capabilities(python)
    assert caps["errors"] == {}
    assert caps["schema"] == 1
    assert caps["vllm_version"] == "dev"  # a source tree: no metadata, vllm.__version__
    assert {"ngram", "eagle3", "mtp", "dflash", "dspark"} <= set(caps["speculative_methods"])
    assert caps["mtp_aliases"] == []
    assert caps["rejection_sample_methods"] == ["standard", "synthetic", "block"]
    assert caps["draft_sample_methods"] == ["greedy", "probabilistic"]
    assert {"model", "num_speculative_tokens", "draft_tensor_parallel_size", "attention_backend"} <= set(
        caps["speculative_fields"]
    )
    assert "unknown_fields" not in caps["speculative_fields"]  # the fixture's own, not settable
    assert "DFlashDraftModel" in caps["registered_architectures"]
    assert caps["registered_architectures"] == sorted(caps["registered_architectures"])
    assert "FLASH_ATTN" in caps["attention_backends"]
    flags = caps["serve_flags"]
    assert flags["--port"] == {"dest": "port", "takes_value": True, "choices": None, "negatable": False}
    assert flags["--enable-prefix-caching"]["negatable"] is True
    assert flags["--no-enable-prefix-caching"]["dest"] == "enable_prefix_caching"
    assert flags["--tensor-parallel-size"]["takes_value"] is True
    assert "-tp" not in flags  # long options only
    assert caps["default_model_runner"] == "v2"


def test_the_fixture_parser_is_the_one_vllm_serve_uses(tmp_path: Path) -> None:
    """make_arg_parser feeds `vllm serve`: the negatable flag parses both ways through the CLI's parser."""
    sys.path.insert(0, str(ENGINE_SOURCE))
    try:
        from vllm.entrypoints.cli.main import make_parser

        parser, _serve = make_parser()
        on = parser.parse_args(["serve", "m", "--enable-prefix-caching"])
        off = parser.parse_args(["serve", "m", "--no-enable-prefix-caching"])
        unset = parser.parse_args(["serve", "m"])
        assert (on.enable_prefix_caching, off.enable_prefix_caching, unset.enable_prefix_caching) == (True, False, None)
    finally:
        sys.path.remove(str(ENGINE_SOURCE))
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]


# --- each release shape -----------------------------------------------------------------------------
def test_shape_0_20_old_paths_and_no_runner_property(tmp_path: Path) -> None:
    python = fake_vllm(tmp_path, SHAPE_0_20, "0.20.1", ["LlamaForCausalLM", "EagleLlamaForCausalLM"])
    caps = capabilities(python)
    assert caps["errors"] == {}
    assert caps["vllm_version"] == "0.20.1"
    assert caps["speculative_methods"] == ["ngram", "medusa", "eagle", "deepseek_mtp", "mtp"]
    assert caps["mtp_aliases"] == ["deepseek_mtp"]
    assert caps["rejection_sample_methods"] == ["strict", "probabilistic", "synthetic"]
    assert caps["draft_sample_methods"] == []  # no such field yet: empty, not an error
    assert caps["speculative_fields"] == ["model", "method", "rejection_sample_method"]
    assert caps["registered_architectures"] == ["EagleLlamaForCausalLM", "LlamaForCausalLM"]
    assert caps["attention_backends"] == ["FLASH_ATTN", "XFORMERS"]
    assert sorted(caps["serve_flags"]) == ["--disable-log-requests", "--help", "--port"]
    assert caps["serve_flags"]["--disable-log-requests"] == {
        "dest": "disable_log_requests",
        "takes_value": False,
        "choices": None,
        "negatable": False,
    }
    assert caps["default_model_runner"] == "v1"


def test_shape_0_26(tmp_path: Path) -> None:
    python = fake_vllm(tmp_path, SHAPE_0_26, "0.26.0", ["DFlashDraftModel", "Qwen3ForCausalLM"])
    caps = capabilities(python)
    assert caps["errors"] == {}
    assert caps["speculative_methods"] == [
        "ngram", "medusa", "mlp_speculator", "eagle", "eagle3", "deepseek_mtp", "qwen3_5_mtp", "mtp", "dflash", "dspark"
    ]  # fmt: skip
    assert caps["mtp_aliases"] == ["deepseek_mtp", "qwen3_5_mtp"]
    assert caps["draft_sample_methods"] == ["greedy", "probabilistic"]
    assert "cached" not in caps["speculative_fields"]  # init=False: not something a config may set
    assert caps["attention_backends"] == ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]
    flags = caps["serve_flags"]
    assert flags["--enable-prefix-caching"]["negatable"] and flags["--no-enable-prefix-caching"]["negatable"]
    assert flags["--kv-cache-dtype"]["choices"] == ["auto", "fp8"]
    assert caps["default_model_runner"] == "v1"  # no model: V2 only for the models that default to it


def test_default_runner_is_the_one_chosen_with_the_variable_unset(tmp_path: Path) -> None:
    python = fake_vllm(tmp_path, SHAPE_0_26, "0.26.0", [])
    assert capabilities(python, {"VLLM_USE_V2_MODEL_RUNNER": "1"})["default_model_runner"] == "v1"


def test_shape_0_33_new_paths_string_annotations_and_config_that_needs_a_device(tmp_path: Path) -> None:
    python = fake_vllm(tmp_path, SHAPE_0_33, "0.33.0", ["DFlash2DraftModel", "DFlashDraftModel"])
    caps = capabilities(python)
    assert caps["errors"] == {}
    assert "medusa" not in caps["speculative_methods"]
    assert caps["mtp_aliases"] == ["deepseek_mtp", "gemma4_mtp"]
    assert caps["rejection_sample_methods"] == ["standard", "synthetic", "block", "fly"]
    assert caps["draft_sample_methods"] == ["greedy", "probabilistic"]  # Optional[Literal] unfolded
    flags = caps["serve_flags"]
    assert "--attention-backend" in flags  # from vllm.entrypoints.common.cli_args
    # What the parser accepts, hidden from help or not (the --disable-x alias only where registered).
    assert flags["--no-enable-prefix-caching"]["dest"] == "enable_prefix_caching"
    assert flags["--enable-prefix-caching"]["negatable"] is True
    # VllmConfig() raised: its field defaults were used; Triton, missing on a CPU host, counts as present.
    assert caps["default_model_runner"] == "v2"


def test_a_missing_piece_is_an_error_for_its_key_only(tmp_path: Path) -> None:
    shape = dict(SHAPE_0_26)
    shape["vllm/config/speculative.py"] = shape["vllm/config/speculative.py"].replace("SpeculativeMethod =", "Method =")
    shape["vllm/config/speculative.py"] = shape["vllm/config/speculative.py"].replace(
        "method: Optional[SpeculativeMethod]", "method: Optional[Method]"
    )
    shape["vllm/v1/attention/backends/registry.py"] = "raise ImportError('no attention here')\n"
    python = fake_vllm(tmp_path, shape, "0.26.0", ["DFlashDraftModel"])
    caps = capabilities(python)
    assert sorted(caps["errors"]) == ["attention_backends", "speculative_methods"]
    assert "SpeculativeMethod" in caps["errors"]["speculative_methods"]
    assert "no attention here" in caps["errors"]["attention_backends"]
    assert caps["speculative_methods"] == [] and caps["attention_backends"] == []
    assert caps["registered_architectures"] == ["DFlashDraftModel"]
    assert caps["rejection_sample_methods"] == ["standard", "synthetic", "block"]
    assert "--port" in caps["serve_flags"]


def test_no_vllm_at_all_fills_errors_for_every_key(tmp_path: Path) -> None:
    python = make_venv(tmp_path)
    caps = capabilities(python)
    assert sorted(caps["errors"]) == sorted(cap.CAPABILITY_KEYS)
    assert caps["vllm_version"] is None and caps["serve_flags"] == {} and caps["default_model_runner"] is None


def test_stray_output_cannot_break_or_forge_the_result(tmp_path: Path) -> None:
    forged = json.dumps({"schema": 1, "vllm_version": "9.9.9"})
    shape = dict(SHAPE_0_26)
    shape["vllm/config/speculative.py"] = (
        "import os, sys\n"
        f"print('@@vllm_capabilities:forged@@ {forged}')\n"
        "sys.stdout.write('unterminated log line')\n"
        "os.write(1, b'written at the C level\\n')\n" + textwrap.dedent(shape["vllm/config/speculative.py"])
    )
    python = fake_vllm(tmp_path, shape, "0.26.0", [])
    result, mark = run_script(python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(mark + " ")
    assert len(result.stdout.strip().splitlines()) == 1
    assert "written at the C level" in result.stderr and "forged" in result.stderr
    caps = cap.parse_capability_output(result.stdout, mark)
    assert caps["vllm_version"] == "0.26.0" and caps["errors"] == {}


def test_quiet_offline_and_no_cache_left_behind(tmp_path: Path) -> None:
    record = tmp_path / "env.json"
    shape = dict(SHAPE_0_26)
    shape["vllm/config/speculative.py"] = (
        "import json, os\n"
        "names = ('VLLM_LOGGING_LEVEL', 'HF_HUB_OFFLINE', 'VLLM_NO_USAGE_STATS', 'DO_NOT_TRACK',\n"
        "         'XDG_CACHE_HOME', 'VLLM_CACHE_ROOT', 'VLLM_USE_V2_MODEL_RUNNER', 'CUDA_VISIBLE_DEVICES')\n"
        f"json.dump({{n: os.environ.get(n) for n in names}}, open({str(record)!r}, 'w'))\n"
        "os.makedirs(os.environ['VLLM_CACHE_ROOT'])\n" + textwrap.dedent(shape["vllm/config/speculative.py"])
    )
    python = fake_vllm(tmp_path, shape, "0.26.0", [])
    capabilities(python, {"VLLM_USE_V2_MODEL_RUNNER": "0", "HF_HUB_OFFLINE": "0", "CUDA_VISIBLE_DEVICES": "0,1"})
    seen = json.loads(record.read_text())
    assert seen["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert seen["HF_HUB_OFFLINE"] == seen["VLLM_NO_USAGE_STATS"] == seen["DO_NOT_TRACK"] == "1"
    assert seen["VLLM_USE_V2_MODEL_RUNNER"] is None
    assert seen["CUDA_VISIBLE_DEVICES"] == ""  # a GPU host that serves keeps its GPUs to itself
    assert not Path(seen["VLLM_CACHE_ROOT"]).exists() and not Path(seen["XDG_CACHE_HOME"]).exists()


def test_a_python_killed_mid_import_gives_no_result(tmp_path: Path) -> None:
    shape = dict(SHAPE_0_26)
    shape["vllm/config/speculative.py"] = "import os\nos._exit(3)\n"
    python = fake_vllm(tmp_path, shape, "0.26.0", [])
    result, mark = run_script(python)
    assert result.returncode == 3
    with pytest.raises(cap.CapabilityError, match=r"printed no result line.*Fix:"):
        cap.parse_capability_output(result.stdout, mark)


def test_sys_exit_during_an_import_is_an_error_for_that_key(tmp_path: Path) -> None:
    shape = dict(SHAPE_0_26)
    shape["vllm/model_executor/models/registry.py"] = "import sys\nsys.exit('registry exits')\n"
    python = fake_vllm(tmp_path, shape, "0.26.0", [])
    caps = capabilities(python)
    assert list(caps["errors"]) == ["registered_architectures"]
    assert "registry exits" in caps["errors"]["registered_architectures"]


def test_the_script_keeps_python_3_8_syntax() -> None:
    ast.parse(cap.CAPABILITY_SCRIPT, feature_version=(3, 8))


# --- the parser -------------------------------------------------------------------------------------
def valid() -> Dict[str, Any]:
    obj: Dict[str, Any] = {key: [] for key in cap.CAPABILITY_KEYS}
    obj.update(
        schema=1,
        vllm_version="0.33.0",
        serve_flags={"--port": {"dest": "port", "takes_value": True, "choices": None, "negatable": False}},
        default_model_runner="v2",
        errors={},
    )
    return obj


def test_parse_takes_the_line_with_this_runs_mark_only() -> None:
    mark = cap.new_mark()
    other = dict(valid(), vllm_version="forged")
    stdout = f"log line\n{cap.new_mark()} {json.dumps(other)}\n\n{mark} {json.dumps(valid())}\nafter\n"
    assert cap.parse_capability_output(stdout, mark)["vllm_version"] == "0.33.0"


def test_parse_refuses_no_line_and_bad_json() -> None:
    mark = cap.new_mark()
    with pytest.raises(cap.CapabilityError, match="no result line"):
        cap.parse_capability_output("INFO importing vllm\n", mark)
    with pytest.raises(cap.CapabilityError, match="not JSON"):
        cap.parse_capability_output(f"{mark} {{truncated\n", mark)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": 2}, "schema is 2"),
        ({"speculative_methods": "ngram"}, "speculative_methods must be a list of strings"),
        ({"registered_architectures": [1]}, "registered_architectures must be a list of strings"),
        ({"default_model_runner": "v3"}, "default_model_runner must be"),
        ({"vllm_version": 26}, "vllm_version must be a string or null"),
        ({"errors": {"nonsense": "x"}}, "not capabilities: nonsense"),
        ({"errors": {"serve_flags": 1}}, "errors must be a mapping"),
        ({"serve_flags": {"--port": {"dest": "port"}}}, r"serve_flags\['--port'\] must have exactly"),
        ({"serve_flags": {"port": {}}}, "must be a long option"),
        ({"extra": 1}, "unknown keys extra"),
    ],
)
def test_check_names_what_breaks_the_schema(change: Dict[str, Any], message: str) -> None:
    with pytest.raises(cap.CapabilityError, match=message):
        cap.check_capabilities(dict(valid(), **change))


def test_check_names_missing_keys_and_the_fix() -> None:
    broken = valid()
    del broken["serve_flags"]
    with pytest.raises(cap.CapabilityError, match=r"missing keys serve_flags.*Fix: delete it"):
        cap.check_capabilities(broken, "/opt/vllm/releases/x/capabilities.json")
    assert cap.check_capabilities(valid()) == valid()
