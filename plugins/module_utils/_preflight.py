# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight of a vLLM serve config, its speculative config and its DFlash drafter against the installed vLLM.

A config that would crash the service, or worse run with a drafter that silently accepts nothing, is
refused before any file changes. What vLLM accepts (methods, sampler values, SpeculativeConfig fields,
registered draft architectures, attention backends, the flags of `vllm serve`) is what the installed vLLM
answered itself: the `capabilities` of `vllm_facts`. Only when it could not answer are the tables of
``_vllm_data.py`` used, and the result says which. What no API tells (the seed's bugs in the sources) is
read from the boolean probes `vllm_facts` ran on the release's files, never guessed from the version.

Standard library only: this runs on the target's system Python.

One file over 600 lines on purpose: the checks are the methods of one _Preflight over one config and one
set of answers (capabilities, probes, drafter); apart, each would take the whole of it as arguments.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.vllm_ops.dflash.plugins.module_utils import _vllm_data as data
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import sha256_file
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drafter import (
    SLIDING_ATTENTION,
    PreflightError,
    as_int,
    dflash_needs_non_causal,
    is_int,
    load_drafter_config,
    mapping,
    message,
)

__all__ = ["DEFAULT_CAPABILITY_PROBES", "ERROR", "WARNING", "PreflightError", "parse_env_flag", "preflight"]

ERROR = "error"
WARNING = "warning"
# An auto_map entry as transformers spells it: `module.Class`, optionally `repo/id--module.Class`.
_CODE_REF = re.compile(r"^[\w./-]{1,200}$")
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# question -> probe name in vllm_facts.probes; the probes themselves are data (docs/probes.md).
DEFAULT_CAPABILITY_PROBES = {
    "aux_layer_offset": "dflash_aux_layer_offset",
    "aux_layer_offset_v2": "dflash_aux_layer_offset_v2",
    "v2_runner_dflash": "dflash_v2_runner",
    "sliding_window": "dflash_sliding_window",
    "mixed_attention_v2": "dflash_mixed_attention_v2",
    "mixed_attention_auto_v2": "dflash_mixed_attention_auto_v2",
}
# Capability keys where an empty list is an answer (the field or the aliases do not exist), not a failure.
_EMPTY_IS_AN_ANSWER = ("mtp_aliases", "rejection_sample_methods", "draft_sample_methods")
# A top-level `is_causal` in the drafter config is read from this release on.
_IS_CAUSAL_SINCE = (0, 28, 0)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_env_flag(value: Any) -> Optional[bool]:
    """A vLLM boolean env var as vLLM reads it, bool(int(value)); None when unset; ValueError when vLLM would fail."""
    if value is None:
        return None
    if isinstance(value, bool):
        # YAML `true` reaches the env file as "True", and int("True") fails inside vLLM.
        raise ValueError(f"a YAML boolean is written to the env file as {str(value)!r}")
    return bool(int(str(value)))


def _unwrap_facts(vllm_facts: Optional[Mapping[str, Any]]) -> Mapping[str, Any]:
    """ansible_facts.vllm itself, or the same taken out of a registered vllm_facts result."""
    facts: Mapping[str, Any] = vllm_facts or {}
    facts = mapping(facts.get("ansible_facts")) or facts
    if "probes" not in facts and isinstance(facts.get("vllm"), Mapping):
        facts = facts["vllm"]
    return facts


def _close(name: str, choices: Sequence[str], cutoff: float = 0.6) -> List[str]:
    return difflib.get_close_matches(name, list(choices), n=3, cutoff=cutoff)


def _one_of(choices: Sequence[str], limit: int = 40) -> str:
    shown = ", ".join(sorted(choices)[:limit])
    return shown + (f" (and {len(choices) - limit} more)" if len(choices) > limit else "")


class _Preflight:
    def __init__(
        self,
        vllm_facts: Optional[Mapping[str, Any]],
        capability_probes: Optional[Mapping[str, str]],
        env: Optional[Mapping[str, Any]],
    ) -> None:
        facts = _unwrap_facts(vllm_facts)
        self.version = str(facts.get("version") or "(version unknown)")
        self.probes = mapping(facts.get("probes"))
        self.probe_errors = mapping(facts.get("probe_errors"))
        self.capabilities = mapping(facts.get("capabilities"))
        self.capability_errors = mapping(self.capabilities.get("errors"))
        self.capabilities_error = facts.get("capabilities_error")
        self.fallback_release = data.fallback_release(facts.get("version"))
        self.fallback_keys: List[str] = []
        self.capability_probes = dict(DEFAULT_CAPABILITY_PROBES)
        self.capability_probes.update(capability_probes or {})
        self.env = env or {}
        release = data.release_tuple(facts.get("version"))
        self.honours_is_causal = release is None or release >= _IS_CAUSAL_SINCE
        self.findings: List[Dict[str, str]] = []

    def error(self, field: str, problem: str, fix: str) -> None:
        self.findings.append({"level": ERROR, "field": field, "message": message(field, problem, fix)})

    def warn(self, field: str, problem: str, fix: str) -> None:
        self.findings.append({"level": WARNING, "field": field, "message": message(field, problem, fix)})

    # ----------------------------------------------------------------------- what vLLM accepts

    def from_installed(self, key: str) -> bool:
        """Whether the installed vLLM answered for a capability key."""
        if key in self.capability_errors or key not in self.capabilities:
            return False
        value = self.capabilities[key]
        if key == "default_model_runner":  # null: the release picks per model
            return value in ("v1", "v2", None)
        return value is not None and (value != [] or key in _EMPTY_IS_AN_ANSWER)

    def installed(self, key: str) -> Any:
        """The installed vLLM's own answer for a capability key; None when it gave none."""
        return self.capabilities[key] if self.from_installed(key) else None

    def accepts(self, key: str) -> Any:
        """The installed vLLM's answer, else (noted for the fallback finding) the table of _vllm_data."""
        if self.from_installed(key):
            return self.capabilities[key]
        if key not in self.fallback_keys:
            self.fallback_keys.append(key)
        return data.RELEASES[self.fallback_release][key]

    def source(self, key: str) -> str:
        if self.from_installed(key):
            return f"vLLM {self.version}"
        return f"the fallback table of vLLM {self.fallback_release}"

    def report_fallback(self) -> None:
        if not self.fallback_keys:
            return
        if not self.capabilities:
            why = f"vllm_facts has no capabilities of this vLLM {self.version}"
            if self.capabilities_error:
                why += f" ({self.capabilities_error})"
        else:
            failed = {key: self.capability_errors.get(key, "not returned") for key in self.fallback_keys}
            why = "the installed vLLM did not answer " + "; ".join(f"{k}: {v}" for k, v in failed.items())
        self.warn(
            "vllm_facts.capabilities",
            f"{why}, so {', '.join(self.fallback_keys)} were judged against the fallback tables of vLLM "
            f"{self.fallback_release} (_vllm_data.py), which may differ from what this release accepts",
            "make `import vllm.config` work in the release venv (or raise vllm_facts capabilities_timeout) and "
            "re-run vllm_facts",
        )

    def probe(self, question: str) -> Optional[bool]:
        """The probe's answer; None, with an error finding, when it was not run or failed."""
        name = self.capability_probes.get(question)
        if not name:
            self.error(
                f"capability_probes.{question}",
                "no probe is mapped to this question",
                f"map it to a probe name (default: {DEFAULT_CAPABILITY_PROBES.get(question)})",
            )
            return None
        answer = self.probes.get(name)
        if isinstance(answer, bool):
            return answer
        reason = self.probe_errors.get(name)
        if reason:
            problem = f"probe {name} failed on vLLM {self.version}: {reason}"
            fix = "correct its path or pattern in vllm_probes and re-run vllm_facts"
        else:
            problem = f"probe {name} not run"
            fix = "add it to vllm_probes (see docs/probes.md) and re-run vllm_facts before this preflight"
        self.error(f"vllm_facts.probes.{name}", problem, fix)
        return None

    # ----------------------------------------------------------------------- speculative config

    def normalise_keys(self, spec: Mapping[str, Any]) -> Dict[str, Any]:
        """Keys in vLLM's spelling (snake_case: the serve YAML's kebab-case stops at speculative-config)."""
        out: Dict[str, Any] = {}
        for key, value in spec.items():
            name = str(key).replace("-", "_")
            if name in out and out[name] != value:
                self.error(
                    f"speculative_config.{name}",
                    f"given twice, as {out[name]!r} and {value!r}",
                    f"keep one spelling: {name}",
                )
            out[name] = value
        fields = self.accepts("speculative_fields")
        for name in out:
            if name in fields:
                continue
            field = f"speculative_config.{name}"
            close = _close(name, fields, cutoff=0.7)
            problem = (
                f"not a SpeculativeConfig field of {self.source('speculative_fields')}, and vLLM refuses unknown fields"
            )
            if close:
                self.error(field, problem, f"rename it {' or '.join(close)}")
            elif self.from_installed("speculative_fields"):
                self.error(field, problem, f"remove it; its fields are {_one_of(fields, limit=60)}")
            else:  # a table may miss a field the installed release added
                self.warn(field, problem, "remove it, unless the installed vLLM added this field")
        return out

    def resolve_method(self, spec: Mapping[str, Any]) -> Optional[str]:
        """The method vLLM will run (SpeculativeConfig.__post_init__), or None when vLLM would refuse it."""
        methods = self.accepts("speculative_methods")
        aliases = [name for name in self.accepts("mtp_aliases") if name != "mtp"]
        model = spec.get("model")
        given = spec.get("method")
        field = "speculative_config.method"
        if given is None:
            method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
        elif isinstance(given, str):
            method = "ngram" if given == "[ngram]" else given
        else:
            self.error(field, f"must be a string, got {given!r}", f"set one of {_one_of(methods)}")
            return None
        if method not in methods and method not in aliases:
            plain = [m for m in methods if m not in aliases]
            close = _close(method, plain)
            self.error(
                field,
                f"{method!r} is not a speculative method of {self.source('speculative_methods')} "
                "(vLLM refuses the config at startup)",
                f"use {' or '.join(close)}" if close else f"use one of {_one_of(plain)}",
            )
            return None
        if method in aliases:
            self.warn(field, f"{method} is deprecated and vLLM replaces it with mtp", "set method: mtp")
            method = "mtp"
        # vLLM re-detects draft-checkpoint methods from the model name, whether or not a method was given.
        if isinstance(model, str) and method in data.METHODS_REDETECTED:
            lowered = model.lower()
            for marker, detected in data.METHOD_MARKERS:
                if marker in lowered and detected in methods:
                    if given is not None:
                        self.warn(
                            field,
                            f"vLLM runs {method} as {detected} because the model name contains {marker!r}",
                            f"set method: {detected}",
                        )
                    return detected
        return method

    def check_model(self, spec: Mapping[str, Any], method: Optional[str]) -> None:
        if method in data.METHODS_NEEDING_MODEL and not spec.get("model"):
            self.error(
                "speculative_config.model",
                f"missing, and method {method} loads a draft checkpoint",
                "set model to the drafter (e.g. z-lab/Qwen3.6-27B-DFlash or its local directory)",
            )

    def check_num_speculative_tokens(
        self, spec: Dict[str, Any], method: Optional[str], drafter: Optional[Mapping[str, Any]]
    ) -> Optional[int]:
        """K after defaulting (written back into spec), or None when missing or invalid."""
        field = "speculative_config.num_speculative_tokens"
        block_size = as_int(drafter.get("block_size")) if drafter else None
        raw = spec.get("num_speculative_tokens")
        if raw is None:
            if method == "dflash" and block_size is not None and block_size > 1:
                # vLLM itself has no default for DFlash: without K it refuses to start.
                spec["num_speculative_tokens"] = block_size - 1
                return block_size - 1
            if method is not None and method not in data.METHODS_WITH_OWN_K:
                why = " and the drafter has no block_size to default from" if method == "dflash" else ""
                self.error(field, f"missing{why}", "set it; DFlash drafters use their block_size - 1, e.g. 15 for 16")
            return None
        k = as_int(raw)
        if k is None:
            self.error(field, f"must be an integer, got {raw!r}", "set a positive integer such as 15")
            return None
        if k <= 0:
            self.error(field, f"must be greater than zero, got {k}", "set a positive integer (DFlash: block_size - 1)")
            return None
        spec["num_speculative_tokens"] = k
        if method == "dflash" and block_size is not None and k > block_size - 1:
            self.warn(
                field,
                f"{k} is more than the drafter's block_size - 1 = {block_size - 1}, the most it was trained to draft",
                f"set num_speculative_tokens: {block_size - 1}",
            )
        return k

    def check_parallelism(self, spec: Mapping[str, Any], tensor_parallel_size: Any) -> None:
        if "tensor_parallel_size" in spec:
            self.error(
                "speculative_config.tensor_parallel_size",
                "not valid inside the speculative config (vLLM raises ValueError)",
                "rename it draft_tensor_parallel_size (1 or the target's tensor_parallel_size)",
            )
        target_tp = as_int(tensor_parallel_size)
        if target_tp is None or target_tp < 1:
            self.error(
                "tensor_parallel_size",
                f"must be a positive integer, got {tensor_parallel_size!r}",
                "pass the target's --tensor-parallel-size",
            )
            return
        raw = spec.get("draft_tensor_parallel_size")
        if raw is None:
            return
        field = "speculative_config.draft_tensor_parallel_size"
        draft_tp = as_int(raw)
        if draft_tp is None or draft_tp < 1:
            self.error(field, f"must be a positive integer, got {raw!r}", f"set 1 or {target_tp}")
        elif draft_tp not in (1, target_tp):
            self.error(
                field,
                f"{draft_tp} is neither 1 nor the target's tensor_parallel_size {target_tp} (vLLM raises ValueError)",
                f"set 1 or {target_tp}",
            )

    def _check_choice(self, spec: Mapping[str, Any], name: str, key: str) -> Any:
        value = spec.get(name)
        if value is None:
            return None
        choices = self.accepts(key)
        if value not in choices:
            self.error(
                f"speculative_config.{name}",
                f"{value!r} is not a value {self.source(key)} accepts",
                f"use one of {', '.join(choices)}" if choices else f"remove it: {self.source(key)} has no {name}",
            )
            return None
        return value

    def check_sampling(self, spec: Mapping[str, Any], k: Optional[int]) -> None:
        method = self._check_choice(spec, "rejection_sample_method", "rejection_sample_methods")
        if method == "synthetic":
            self._check_synthetic(spec.get("synthetic_acceptance_rates"), spec.get("synthetic_acceptance_length"), k)
        elif method is not None or spec.get("rejection_sample_method") is None:
            for name in ("synthetic_acceptance_rates", "synthetic_acceptance_length"):
                if spec.get(name) is not None:
                    self.error(
                        f"speculative_config.{name}",
                        "only valid with rejection_sample_method: synthetic (vLLM raises ValueError)",
                        "remove it (or set rejection_sample_method: synthetic in a test deployment)",
                    )
        self._check_choice(spec, "draft_sample_method", "draft_sample_methods")

    def _check_synthetic(self, rates: Any, length: Any, k: Optional[int]) -> None:
        if (rates is None) == (length is None):
            self.error(
                "speculative_config.synthetic_acceptance_length",
                "rejection_sample_method: synthetic needs exactly one of synthetic_acceptance_length and "
                "synthetic_acceptance_rates (vLLM raises ValueError)",
                "set synthetic_acceptance_length (e.g. 3.0) alone",
            )
            return
        self.warn(
            "speculative_config.rejection_sample_method",
            "synthetic is a test-only setting: vLLM accepts draft tokens at a forced rate, so the output is not "
            "the target model's and the acceptance metrics measure nothing",
            "use it only to test the acceptance gate; remove it (standard) in production",
        )
        if length is not None:
            field = "speculative_config.synthetic_acceptance_length"
            if not _is_number(length):
                self.error(field, f"must be a number, got {length!r}", "set a float such as 3.0")
            elif k is not None and not 1.0 <= length <= k + 1:
                self.error(field, f"{length} is outside [1, num_speculative_tokens + 1 = {k + 1}]", "set one inside")
            return
        field = "speculative_config.synthetic_acceptance_rates"
        if not isinstance(rates, list) or not all(_is_number(r) for r in rates):
            self.error(field, f"must be a list of numbers, got {rates!r}", "set e.g. [0.8, 0.6, 0.4]")
        elif k is not None and len(rates) != k:
            self.error(field, f"has {len(rates)} entries for {k} speculative tokens", "give one rate per token")
        elif not all(0.0 <= r <= 1.0 for r in rates):
            self.error(field, f"entries must be in [0, 1], got {rates!r}", "use probabilities")
        elif any(later > earlier for earlier, later in zip(rates, rates[1:])):
            self.error(
                field,
                f"must be non-increasing, got {rates!r} (they are unconditional per-position rates)",
                "sort them in decreasing order",
            )

    def _backend_name(self, field: str, backend: Any) -> Optional[str]:
        """The enum name of a backend vLLM accepts; None (with an error when unknown) for auto or bad ones."""
        if backend is None or str(backend).lower() in ("", "auto"):
            return None
        name = str(backend).upper()
        backends = self.accepts("attention_backends")
        if name not in backends:
            close = _close(name, backends)
            self.error(
                field,
                f"{backend!r} is not an attention backend of {self.source('attention_backends')} (vLLM raises "
                "ValueError)",
                f"use {' or '.join(close)}" if close else f"use one of {_one_of(backends)}, or auto",
            )
            return None
        return name

    def check_attention_backend(
        self,
        spec: Mapping[str, Any],
        method: Optional[str],
        drafter: Optional[Mapping[str, Any]],
        serve_backend: Any,
    ) -> None:
        own = spec.get("attention_backend")
        if own is not None and str(own).lower() != "auto":
            field = "speculative_config.attention_backend"
            name = self._backend_name(field, own)
            fix = "set attention_backend: FLASH_ATTN, or leave it unset so that vLLM picks one"
        else:
            # The drafter inherits the serve-level backend when its own is unset (_DRAFT_VLLM_CONFIG_OVERRIDES).
            field = "serve_config.attention-backend"
            name = self._backend_name(field, serve_backend)
            fix = (
                "set speculative_config.attention_backend: FLASH_ATTN for the drafter, or a serve-level "
                "attention-backend with non-causal attention"
            )
        if (
            name is not None
            and method == "dflash"
            and name not in data.NON_CAUSAL_BACKENDS
            and (drafter is None or dflash_needs_non_causal(drafter, self.honours_is_causal))
        ):
            # vllm/platforms/cuda.py raises "Selected backend ... is not valid" for an explicit backend.
            self.error(
                field,
                f"{name} has no non-causal attention, which this DFlash drafter needs: vLLM refuses the selected "
                "backend at startup ('non-causal attention not supported')",
                fix,
            )

    def check_env(self) -> None:
        value = self.env.get(V2_RUNNER_ENV)
        try:
            parse_env_flag(value)
        except ValueError:
            self.error(
                f"env.{V2_RUNNER_ENV}",
                f"{value!r} is not an integer, and vLLM reads it with int() and fails to start",
                "set it to '1' or '0' (quoted in YAML)",
            )

    # ----------------------------------------------------------------------- serve config

    def check_serve_config(self, serve: Mapping[str, Any]) -> None:
        """Every key of the `vllm serve --config` YAML against the installed vLLM's own `serve` parser."""
        flags = mapping(self.installed("serve_flags"))
        if not flags:
            reason = self.capability_errors.get("serve_flags") or self.capabilities_error or "capabilities unavailable"
            self.warn(
                "serve_config",
                f"not checked against the flags of vLLM {self.version}'s own parser ({reason}); an unknown flag "
                "makes vLLM exit at startup",
                "make `import vllm` work in the release venv and re-run vllm_facts",
            )
            return
        names = sorted(flag[2:] for flag in flags if str(flag).startswith("--"))
        for key, value in serve.items():
            self._check_serve_flag(str(key), value, flags, names)

    def _check_serve_flag(self, key: str, value: Any, flags: Mapping[str, Any], names: Sequence[str]) -> None:
        field = f"serve_config.{key}"
        name = key.replace("_", "-")  # vLLM's parser takes --a_b as --a-b
        spec = mapping(flags.get("--" + name))
        if not spec:
            positive = name[3:] if name.startswith("no-") else None
            plain = mapping(flags.get("--" + positive)) if positive else {}
            if plain and value is True:
                # A `false` rendered as no-<flag>: true (the loader drops a YAML false) that this vLLM cannot parse.
                self._refuse_false(str(positive), plain, flags)
                return
            close = _close(name, names)
            self.error(
                field,
                f"--{name} is not a flag of vLLM {self.version}'s `vllm serve` (it exits at startup: unrecognized "
                "arguments)",
                f"rename it {' or '.join(close)}" if close else "remove it (see `vllm serve --help`)",
            )
            return
        if isinstance(value, bool):
            if value is False:  # serve.yaml.j2 writes no-<flag>: true instead
                self.error(
                    field,
                    "false is dropped by vLLM's --config loader, so the flag keeps its default",
                    f"write no-{name}: true" if spec.get("negatable") else f"remove {key}",
                )
            elif spec.get("takes_value"):
                self.error(
                    field,
                    f"true is passed as the bare flag --{name}, but --{name} takes a value (vLLM exits at startup)",
                    f"give its value, quoted: {key}: 'true'",
                )
            return
        if isinstance(value, list) and not value:
            self.error(field, "an empty list is dropped by vLLM's --config loader", f"remove {key} or give items")
            return
        choices = spec.get("choices")
        if (
            isinstance(choices, list)
            and choices
            and not isinstance(value, (list, dict))
            and str(value) not in [str(choice) for choice in choices]
        ):
            self.error(
                field,
                f"{value!r} is not one of the values vLLM {self.version} accepts for --{name}",
                f"use one of {', '.join(map(str, choices))}",
            )

    def _refuse_false(self, name: str, spec: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
        field = f"serve_config.{name}"
        why = (
            f"false is written as no-{name}: true (vLLM's --config loader drops a YAML false), and vLLM "
            f"{self.version} has no --no-{name}"
        )
        if not spec.get("negatable"):
            self.error(
                field,
                f"{why}: --{name} is a plain switch, off unless given",
                f"remove {name} from vllm_serve_extra_args",
            )
            return
        # 0.33 spells some negatives --disable-x, with --enable-x an alias of --no-disable-x (same dest).
        same = sorted(flag[2:] for flag, other in flags.items() if mapping(other).get("dest") == spec.get("dest"))
        opposite = "disable-" + name[len("enable-") :] if name.startswith("enable-") else None
        fix = (
            f"set {opposite}: true instead"
            if opposite in same
            else f"give the setting ({spec.get('dest')}) by one of {', '.join(f for f in same if f != name)}"
        )
        self.error(field, why, fix)

    def check_trust_remote_code(self, serve: Mapping[str, Any], drafter: Optional[Mapping[str, Any]]) -> None:
        """Say what `trust-remote-code: true` lets run: vLLM hands it to transformers for the target, and
        SpeculativeConfig gives the draft model the target's value, so the drafter repo's code runs too."""
        value = next((serve[k] for k in ("trust-remote-code", "trust_remote_code") if k in serve), None)
        if not (value is True or str(value).strip().lower() == "true"):
            return
        auto_map = mapping(mapping(drafter).get("auto_map"))
        named = sorted({str(v) for v in auto_map.values() if isinstance(v, str) and _CODE_REF.match(v)})[:5]
        drafter_code = f"; the drafter's config.json names such code (auto_map: {', '.join(named)})" if named else ""
        self.warn(
            "serve_config.trust-remote-code",
            "true lets vLLM (through transformers) import and run the Python files shipped in the model repos, "
            "the target's and the drafter's (vLLM gives the draft model the target's setting): the "
            "configuration_*.py / modeling_*.py / tokenization_*.py their config's auto_map names run as the "
            f"service user at every start{drafter_code}",
            "remove it unless the model needs it (vLLM runs Qwen3 targets and DFlash drafters natively); if it "
            "must stay, pin both revisions to reviewed commits and stage them with checksums (model_stage)",
        )

    # ----------------------------------------------------------------------- drafter

    def check_drafter(self, drafter: Mapping[str, Any]) -> None:
        self._check_architecture(drafter)
        self._check_layer_config(drafter)
        self._check_target_layers(drafter)
        self._check_sliding_window(drafter)

    def _check_architecture(self, drafter: Mapping[str, Any]) -> None:
        field = "drafter_config.architectures"
        archs = drafter.get("architectures")
        if not isinstance(archs, list) or not archs:
            self.error(field, "missing", "use the drafter's original config.json (architectures: [DFlashDraftModel])")
            return
        # EAGLEConfig prefixes "DFlash" to a name that lacks it (vllm/transformers_utils/configs/eagle.py).
        loaded = [
            a
            if a.startswith("DFlash") or a.endswith("DFlash") or a in data.DFLASH_UNPREFIXED_ARCHITECTURES
            else "DFlash" + a
            for a in map(str, archs)
        ]
        registered = self.accepts("registered_architectures")
        if set(loaded) & set(registered):
            return
        drafts = [a for a in registered if "DFlash" in a or a in data.DFLASH_UNPREFIXED_ARCHITECTURES]
        self.error(
            field,
            f"{', '.join(map(str, archs))}: vLLM would load {', '.join(loaded)}, which "
            f"{self.source('registered_architectures')} does not register",
            f"use a drafter of an architecture it registers ({', '.join(sorted(drafts)) or 'none'}), deploy a vLLM "
            "that registers this one, or set the method that matches this checkpoint",
        )

    def _check_layer_config(self, drafter: Mapping[str, Any]) -> None:
        layer_types = drafter.get("layer_types")
        num_layers = as_int(drafter.get("num_hidden_layers"))
        if isinstance(layer_types, list) and num_layers is not None and len(layer_types) != num_layers:
            self.error(
                "drafter_config.layer_types",
                f"has {len(layer_types)} entries for num_hidden_layers {num_layers}",
                "use the drafter's original config.json (one layer type per drafter layer)",
            )
        # vLLM reads dflash_config.mask_token_id, else a top-level mask_token_id (V2 0.26.0+, V1 0.28.0+).
        if not any(
            key in source
            for key, source in (
                ("mask_token_id", mapping(drafter.get("dflash_config"))),
                ("mask_token_id", drafter),
                ("pard_token", drafter),
                ("ptd_token_id", drafter),
            )
        ):
            self.error(
                "drafter_config.dflash_config.mask_token_id",
                "missing: vLLM needs the mask token for parallel drafting and raises ValueError",
                "use the drafter's original config.json",
            )

    def _check_target_layers(self, drafter: Mapping[str, Any]) -> None:
        field = "drafter_config.dflash_config.target_layer_ids"
        ids = mapping(drafter.get("dflash_config")).get("target_layer_ids")
        explicit_aux = drafter.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            if not explicit_aux:
                self.warn(
                    field,
                    "missing: vLLM falls back to the target model's default auxiliary layers, not the ones the "
                    "drafter was trained on",
                    "use the drafter's original config.json",
                )
            return
        if not isinstance(ids, list) or not all(is_int(i) for i in ids):
            self.error(field, f"must be a list of integers, got {ids!r}", "use the drafter's original config.json")
            return
        num_target = as_int(drafter.get("num_target_layers"))
        if num_target is not None and any(not 0 <= i < num_target for i in ids):
            self.error(
                field,
                f"{[i for i in ids if not 0 <= i < num_target]} out of range for num_target_layers {num_target} "
                f"(valid: 0..{num_target - 1})",
                "use the drafter trained for this target model",
            )
        if not explicit_aux:  # explicit aux layer ids are taken verbatim: the +1 conversion does not apply
            self._check_aux_layer_offset()

    def _check_aux_layer_offset(self) -> None:
        field = "drafter_config.dflash_config.target_layer_ids"
        problem = (
            "this vLLM {version} takes DFlash target_layer_ids literally on its {runner} model runner (probe {probe} "
            "is false), so it reads every hidden state one layer too early (vllm PR #40727 missing) and the drafter "
            "accepts almost nothing"
        )
        for runner, question in (("V1", "aux_layer_offset"), ("V2", "aux_layer_offset_v2")):
            # The V2 runner matters only where it implements DFlash (0.24.0+).
            if runner == "V2" and not self.probe("v2_runner_dflash"):
                continue
            if self.probe(question) is False:
                probe = self.capability_probes[question]
                self.error(field, problem.format(version=self.version, runner=runner, probe=probe), data.AUX_OFFSET_FIX)

    def _check_sliding_window(self, drafter: Mapping[str, Any]) -> None:
        dflash = mapping(drafter.get("dflash_config"))
        layer_types = drafter.get("layer_types")
        layer_types = layer_types if isinstance(layer_types, list) else []
        num_sliding = sum(1 for t in layer_types if t == SLIDING_ATTENTION)
        if not num_sliding and not dflash.get("use_swa"):
            return
        if dflash.get("swa_window_size") is None and drafter.get("sliding_window") is None:
            self.error(
                "drafter_config.sliding_window",
                "the drafter has sliding-window layers but no window size (vLLM raises ValueError)",
                "use the drafter's original config.json",
            )
        field = "drafter_config.layer_types"
        if self.probe("sliding_window") is False:
            self.error(
                field,
                f"the drafter has sliding-window layers, and this vLLM {self.version} runs sliding-window drafter "
                "layers as full attention: the drafter attends to context it was not trained on and acceptance "
                f"collapses (probe {self.capability_probes['sliding_window']} is false)",
                data.SLIDING_FIX,
            )
            return
        if not 0 < num_sliding < len(layer_types):
            return
        mix = f"{num_sliding} sliding-window and {len(layer_types) - num_sliding} full-attention layers"
        if self.probe("mixed_attention_v2") is False:
            self.error(
                field,
                f"the drafter mixes {mix}, which this vLLM {self.version} cannot run (probe "
                f"{self.capability_probes['mixed_attention_v2']} is false; 0.25.x raises NotImplementedError)",
                data.MIXED_FIX,
            )
            return
        self._check_v2_runner(mix)

    def _check_v2_runner(self, mix: str) -> None:
        field = f"env.{V2_RUNNER_ENV}"
        try:
            use_v2 = parse_env_flag(self.env.get(V2_RUNNER_ENV))
        except ValueError:
            return  # check_env reports it
        if use_v2 is False:
            self.error(
                field,
                f"is 0, but this vLLM runs a drafter with {mix} only on the V2 model runner (V1 refuses it at startup)",
                f"set {V2_RUNNER_ENV}=1, or remove it",
            )
            return
        # 0.29.0+ runs everything on V2 unless told otherwise; 0.26-0.28 pick V2 for such a drafter themselves.
        if use_v2 or self.accepts("default_model_runner") == "v2":
            return
        if self.probe("mixed_attention_auto_v2") is False:
            self.error(
                field,
                f"unset, and this vLLM {self.version} defaults to the V1 model runner and does not switch to V2 by "
                f"itself for a drafter with {mix} (probe {self.capability_probes['mixed_attention_auto_v2']} is "
                "false), so V1 refuses it at startup",
                f"set {V2_RUNNER_ENV}=1 in env",
            )


def preflight(
    speculative_config: Optional[Mapping[str, Any]],
    drafter_config: Any = None,
    vllm_facts: Optional[Mapping[str, Any]] = None,
    tensor_parallel_size: Any = 1,
    capability_probes: Optional[Mapping[str, str]] = None,
    env: Optional[Mapping[str, Any]] = None,
    serve_config: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Check a serve config, a speculative config (and, for DFlash, its drafter) against the installed vLLM.

    Returns `speculative_config` (normalised: vLLM key spelling, method resolved, DFlash K defaulted),
    `findings` (list of {level, field, message}), `error_count`, `warning_count`, `drafter_config_path`,
    `drafter_config_sha256`, `capabilities_used` ("vllm" or "fallback") and `fallback_release` / `fallback_keys`.
    """
    if speculative_config is None:
        speculative_config = {}
    if not isinstance(speculative_config, Mapping):
        raise PreflightError(
            "speculative_config",
            f"expected a dict, got {type(speculative_config).__name__}",
            "pass the mapping that goes under speculative-config in the serve config",
        )
    if serve_config is not None and not isinstance(serve_config, Mapping):
        raise PreflightError(
            "serve_config",
            f"expected a dict, got {type(serve_config).__name__}",
            "pass the mapping of the vllm serve --config YAML (long option names as keys)",
        )
    check = _Preflight(vllm_facts, capability_probes, env)
    if serve_config is not None:
        check.check_serve_config(serve_config)
    spec: Dict[str, Any] = {}
    drafter: Optional[Dict[str, Any]] = None
    drafter_path: Optional[str] = None
    if speculative_config:
        spec = check.normalise_keys(speculative_config)
        method = check.resolve_method(spec)
        if method is not None:
            spec["method"] = method
        check.check_model(spec, method)
        model = spec.get("model")
        if method == "dflash":
            source = drafter_config
            if source is None and isinstance(model, str) and os.path.isdir(os.path.expanduser(model)):
                source = model
            if source is None:
                check.error(
                    "drafter_config",
                    f"not given, and speculative_config.model {model!r} is not a directory on this host",
                    "pass drafter_config: the drafter's config.json, its model directory or the Hugging Face cache",
                )
            else:
                try:
                    drafter, drafter_path = load_drafter_config(
                        source, model if isinstance(model, str) else None, spec.get("revision")
                    )
                except PreflightError as exc:
                    check.findings.append({"level": ERROR, "field": exc.field, "message": str(exc)})
        k = check.check_num_speculative_tokens(spec, method, drafter)
        check.check_parallelism(spec, tensor_parallel_size)
        check.check_sampling(spec, k)
        check.check_attention_backend(spec, method, drafter, (serve_config or {}).get("attention-backend"))
        check.check_env()
        if drafter is not None:
            check.check_drafter(drafter)
    if serve_config is not None:
        check.check_trust_remote_code(serve_config, drafter)
    check.report_fallback()

    errors = sum(1 for finding in check.findings if finding["level"] == ERROR)
    return {
        "speculative_config": spec,
        "findings": check.findings,
        "error_count": errors,
        "warning_count": len(check.findings) - errors,
        "drafter_config_path": drafter_path,
        # What the verdict was given on: the deploy records it, and its look sees an in-place change.
        "drafter_config_sha256": sha256_file(drafter_path) if drafter_path else None,
        "capabilities_used": "fallback" if check.fallback_keys else "vllm",
        "fallback_release": check.fallback_release if check.fallback_keys else None,
        "fallback_keys": check.fallback_keys,
    }
