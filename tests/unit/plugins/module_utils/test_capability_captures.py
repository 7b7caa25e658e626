"""The capabilities captured from real vLLM releases (tests/unit/data/capabilities/<version>.json, written
by `make compat`) follow schema 1 and say what those releases are known to say, so that the preflight
tests built on them test against vLLM, not against a hand-made table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _capability_script as cap

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "capabilities"
RELEASES = ("0.20.1", "0.22.0", "0.24.0", "0.26.0", "0.28.0", "0.30.0", "0.33.0")


def load(version: str) -> Dict[str, Any]:
    return json.loads((CAPTURES / f"{version}.json").read_text())


def test_one_capture_per_release_of_the_matrix() -> None:
    assert sorted(path.stem for path in CAPTURES.glob("*.json")) == sorted(RELEASES)


@pytest.mark.parametrize("version", RELEASES)
def test_capture_follows_the_schema_and_read_every_key(version: str) -> None:
    caps = cap.check_capabilities(load(version), f"{version}.json")
    assert caps["vllm_version"] == version
    assert caps["errors"] == {}
    for key in ("speculative_methods", "speculative_fields", "registered_architectures", "attention_backends"):
        assert caps[key], key
        assert len(set(caps[key])) == len(caps[key]), f"{key} lists a name twice"
    assert caps["registered_architectures"] == sorted(caps["registered_architectures"])
    assert set(caps["mtp_aliases"]) < set(caps["speculative_methods"])


@pytest.mark.parametrize("version", RELEASES)
def test_every_negatable_flag_has_its_no_form(version: str) -> None:
    """A YAML false has to be written `no-<flag>: true` (vLLM's --config drops false): the --no- form of
    each BooleanOptionalAction is listed, hidden from help or not."""
    flags = load(version)["serve_flags"]
    assert {"--port", "--speculative-config", "--config", "--model"} <= set(flags)
    groups: Dict[str, List[str]] = {}
    for option, flag in flags.items():
        if flag["negatable"]:
            assert flag["takes_value"] is False, option
            groups.setdefault(flag["dest"], []).append(option)
    assert groups
    for dest, options in groups.items():
        negations = [o for o in options if o.startswith("--no-")]
        assert negations and all(o[:2] + o[5:] in options for o in negations), (dest, options)


def test_what_the_releases_are_known_to_accept() -> None:
    """Facts of vLLM's own source (docs/compat.md, issue 12): a capture of the wrong release fails here."""
    old, current, newest = load("0.20.1"), load("0.26.0"), load("0.33.0")
    assert old["rejection_sample_methods"] == ["strict", "probabilistic", "synthetic"]
    assert old["draft_sample_methods"] == []
    assert current["rejection_sample_methods"] == ["standard", "synthetic", "block"]
    assert {"medusa", "mlp_speculator", "dflash", "dspark"} <= set(current["speculative_methods"])
    assert not {"medusa", "mlp_speculator"} & set(newest["speculative_methods"])
    assert "fly" in newest["rejection_sample_methods"]
    assert {"DFlash2DraftModel", "LiLiCorrDraftModel", "DFlashQwen3XPressModel"} <= set(
        newest["registered_architectures"]
    )
    assert "DFlash2DraftModel" not in current["registered_architectures"]
    assert all(load(v)["default_model_runner"] == "v1" for v in RELEASES if v < "0.29")
    assert all(load(v)["default_model_runner"] == "v2" for v in RELEASES if v > "0.29")
    for option in ("--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-prefix-caching"):
        assert newest["serve_flags"][option]["dest"] == "enable_prefix_caching", option
    assert "--disable-prefix-caching" not in current["serve_flags"]
