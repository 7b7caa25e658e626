"""The roles' input checks as filters (issue 28 cases 8 and 17, issue 27 item 5): each gives the message that
fails the role's check task and the deploy's look, '' when the input passes. The roles' own plays run them
through Ansible (tests/unit/roles/test_names.py, test_env_values.py, test_unit_overrides.py)."""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.filter.env_refusal import env_refusal
from ansible_collections.vllm_ops.dflash.plugins.filter.names_refusal import names_refusal
from ansible_collections.vllm_ops.dflash.plugins.filter.unit_overrides_refusal import unit_overrides_refusal

SECRET = "hf_secret_value_do_not_print"
PLAIN_PATHS = {"vllm_root": "/opt/vllm", "vllm_config_dir": "/etc/vllm/"}


def test_plain_names_and_paths_pass_and_an_unset_name_is_not_checked():
    names = {"vllm_instance": "qwen3-8b_dflash.1", "vllm_user": "vllm", "vllm_group": None}
    assert names_refusal(names, PLAIN_PATHS) == ""
    assert names_refusal({"vllm_instance": "a" * 64}) == ""


@pytest.mark.parametrize(
    ("names", "paths", "named"),
    [
        ({"vllm_instance": "x;touch /tmp/pwned"}, {}, "vllm_instance is"),
        ({"vllm_instance": "x\n"}, {}, "vllm_instance is"),  # `$` would match before the final newline
        ({"vllm_instance": "a" * 65}, {}, "vllm_instance is"),
        ({"vllm_instance": ".hidden"}, {}, "vllm_instance is"),
        ({"vllm_instance": 7}, {"vllm_root": "opt/vllm"}, "vllm_root is"),  # a number is a plain name
        ({"vllm_user": "vllm\nExecStartPre=/bin/sh"}, {"vllm_root": '/opt/x" ; rm -rf "/'}, "vllm_user, vllm_root are"),
    ],
)
def test_a_name_or_path_with_shell_unit_or_path_syntax_is_named(names, paths, named):
    message = names_refusal(names, paths)
    assert message.startswith(f"{named} not a plain name") and message.endswith("Fix: rename them in the inventory.")


def test_env_values_on_one_line_with_plain_names_pass():
    values = {"vllm_hf_token": SECRET, "vllm_api_key": None, "vllm_hf_home": "/var/lib/vllm/hf"}
    assert env_refusal(values, {"NCCL_DEBUG": "WARN", "_X1": 3}, "/etc/vllm/default.env") == ""


@pytest.mark.parametrize(
    ("values", "extra", "named"),
    [
        ({"vllm_api_key": f"{SECRET}\nLD_PRELOAD=/tmp/evil.so"}, {}, "vllm_api_key"),
        ({"vllm_hf_token": f"{SECRET}\x00"}, {}, "vllm_hf_token"),
        ({}, {"FOO": f"{SECRET}\rPYTHONPATH=/tmp"}, "vllm_extra_env.FOO"),
        ({}, {"FOO\nLD_PRELOAD": SECRET}, "a vllm_extra_env name (FOO?LD_PRELOAD)"),
        ({}, {"1FOO": "x"}, "a vllm_extra_env name (1FOO)"),
        ({}, {"A" * 50 + "$": "x"}, "a vllm_extra_env name (" + "A" * 37 + "...)"),
    ],
)
def test_a_line_break_or_a_name_that_is_no_identifier_is_named_never_the_value(values, extra, named):
    message = env_refusal(values, extra, "/etc/vllm/default.env")
    assert message.startswith(f"{named}: a value with a line break")
    assert "would write other lines into /etc/vllm/default.env" in message
    assert SECRET not in message


@pytest.mark.parametrize("overrides", [{}, None, [], {"ProtectHome": "read-only", "LimitNOFILE": 65536, "X1": None}])
def test_no_overrides_or_directives_with_values_pass(overrides):
    assert unit_overrides_refusal(overrides) == ""


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        ({"ProtectHome": "no\nExecStartPre=/bin/sh"}, "fix ProtectHome"),
        ({"Environment": ["A=1", "B=2\rC=3"]}, "fix Environment"),
        ({"protectHome": "no", "Nice": {"a": 1}}, "fix protectHome, Nice"),
        ({"ProtectHome\n": "no"}, "fix ProtectHome\n"),  # a key with a final newline is no directive either
        ("ProtectHome=no", "fix its type (a dict)"),
    ],
)
def test_an_override_that_is_no_directive_or_adds_a_line_is_named(overrides, fix):
    message = unit_overrides_refusal(overrides)
    assert message.startswith("vllm_service_unit_overrides must map [Service] directive names")
    assert message.endswith(fix)
