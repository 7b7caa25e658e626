"""The options of vllm_build: defaults from the one argument spec, checks before anything runs, secrets."""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BUILD_ARGUMENT_SPEC,
    MASK,
    VLLM_BUILD_ARGUMENT_SPEC,
    BuildOptions,
    OptionError,
    build_options,
    option_secrets,
    recorded_build_env,
    recorded_pip_args,
    validate,
)


def test_every_default_comes_from_the_argument_spec():
    opts = BuildOptions("https://example.com/vllm.git", "main")
    for name, spec in {**BUILD_ARGUMENT_SPEC, **VLLM_BUILD_ARGUMENT_SPEC}.items():
        if name in ("repo", "ref"):
            continue
        assert getattr(opts, name) == spec.get("default"), name
    # a mutable default is a copy: one run's options never leak into the next
    opts.build_env["X"] = "1"
    assert BUILD_ARGUMENT_SPEC["build_env"]["default"] == {}
    with pytest.raises(TypeError, match="unknown options: no_such_option"):
        BuildOptions("r", "main", no_such_option=1)


def test_module_params_map_onto_the_options():
    params = {name: spec.get("default") for name, spec in BUILD_ARGUMENT_SPEC.items()}
    params.update(repo="/srv/vllm.git", ref="v1", root="/srv/vllm", build_timeout=60)
    opts = build_options(params, keep_releases=1)
    assert (opts.repo, opts.ref, opts.root, opts.build_timeout, opts.keep_releases) == (
        "/srv/vllm.git",
        "v1",
        "/srv/vllm",
        60.0,
        1,
    )


@pytest.mark.parametrize(
    ("ref", "what"),
    [
        ("main\n", "a control character"),
        ("ma\x00in", "a control character"),
        ("main\t", "a control character"),
        (" main", "leading or trailing spaces"),
        ("", "ref is empty"),
    ],
)
def test_a_ref_no_git_ref_can_be_is_refused(ref, what):
    with pytest.raises(OptionError, match=what) as info:
        validate(BuildOptions("/srv/vllm.git", ref))
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize("expected", ["xyz", "12", "a" * 41, "main"])
def test_an_expected_commit_that_is_no_sha_prefix_is_refused(expected):
    with pytest.raises(OptionError, match="is not a commit SHA or a prefix of one"):
        validate(BuildOptions("/srv/vllm.git", "main", expected_commit=expected))
    validate(BuildOptions("/srv/vllm.git", "main", expected_commit="3CFC8F8B7A1B"))  # a prefix, any case


def test_secrets_are_masked_by_name_and_in_urls():
    env = {"HF_TOKEN": "hf_x1", "WANDB_APIKEY": "k2", "DB_PASS": "p3", "MY_CREDENTIALS": "c4", "hf-token": "t5"}
    env.update(MAX_JOBS="8", INDEX="https://ci:tok6@pypi.example.com/simple")
    recorded = recorded_build_env(env)
    assert [recorded[name] for name in ("HF_TOKEN", "WANDB_APIKEY", "DB_PASS", "MY_CREDENTIALS", "hf-token")] == [
        MASK
    ] * 5
    assert (recorded["MAX_JOBS"], recorded["INDEX"]) == ("8", "https://pypi.example.com/simple")
    args = ["--index-url", "https://__token__:tok7@pypi.example.com/simple", "--no-index"]
    assert recorded_pip_args(args) == ["--index-url", "https://pypi.example.com/simple", "--no-index"]
    params = {
        "repo": "https://oauth2:tok8@git.example.com/vllm.git",
        "precompiled_wheel": "https://tok9@wheels.example.com/vllm.whl",
        "pip_args": args,
        "build_env": env,
    }
    assert option_secrets(params) == {"hf_x1", "k2", "p3", "c4", "t5", "tok6", "tok7", "tok8", "tok9"}


def test_a_github_pat_and_glued_markers_are_masked_in_the_recorded_build_env():
    """Issue 28, case 10: GITHUB_PAT (no marker of the old list) was recorded in clear in the manifest."""
    env = {"GITHUB_PAT": "ghp_1", "HFTOKEN": "hf_2", "OPENAI_APIKEY": "sk_3", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = "/opt/src"
    recorded = recorded_build_env(env)
    assert [recorded[name] for name in ("GITHUB_PAT", "HFTOKEN", "OPENAI_APIKEY")] == [MASK] * 3
    assert (recorded["TOKENIZERS_PARALLELISM"], recorded["PYTHONPATH"]) == ("false", "/opt/src")
    assert option_secrets({"build_env": env}) == {"ghp_1", "hf_2", "sk_3"}
