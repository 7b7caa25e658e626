# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading a DFlash drafter's Hugging Face config as vLLM sees it: where it is, and what it says.

The file is found where vLLM would load it (a model dir, a Hugging Face cache snapshot by revision),
a vllm-project/speculators checkpoint is converted as vLLM converts it, and the drafter's causality is
resolved as vLLM's qwen3_dflash.py resolves it.

Standard library only: this runs on the target's system Python.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils import _untrusted_json

SLIDING_ATTENTION = "sliding_attention"
# A drafter's config.json is a few KiB; a bigger one is not a config and must not take the host's memory.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# A revision as the Hugging Face cache names it: a commit, or a branch/tag (refs/<name>, `/` allowed).
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def message(field: str, problem: str, fix: str) -> str:
    return f"{field}: {problem}. Fix: {fix}"


class PreflightError(Exception):
    """The input cannot be checked at all; the message names the input and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(message(field, problem, fix))
        self.field = field


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value: Any) -> Optional[int]:
    """An int, or a string of digits as Jinja templating leaves it; None for anything else."""
    if is_int(value):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --------------------------------------------------------------------------- drafter config


def _read_json_object(path: str) -> Dict[str, Any]:
    """The JSON object in `path`, read within MAX_CONFIG_BYTES and _untrusted_json.MAX_DEPTH.

    No error quotes the file: the preflight runs as root, and the path can be steered at any file.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise PreflightError(
            "drafter_config",
            f"cannot read {path} ({exc.strerror or exc})",
            "point drafter_config at the drafter's config.json, its model directory or the Hugging Face cache",
        ) from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise PreflightError(
            "drafter_config",
            f"{path} is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB, which no drafter config.json is",
            "point drafter_config at the drafter's config.json (a few KiB), not a weights or data file",
        )
    try:
        data = _untrusted_json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PreflightError(
            "drafter_config",
            f"{path} is not UTF-8 text, so not a config.json",
            "point drafter_config at the drafter's config.json, or download the drafter again",
        ) from None
    except _untrusted_json.TooDeep as exc:
        raise PreflightError(
            "drafter_config",
            f"{path} is {exc}, which no drafter config.json is",
            "point drafter_config at the drafter's own config.json, or download the drafter again",
        ) from None
    except ValueError as exc:  # json.JSONDecodeError: its message gives the position, never the content
        raise PreflightError(
            "drafter_config",
            f"{path} is not valid JSON ({exc})",
            "download the drafter again (the file is truncated or was edited by hand)",
        ) from None
    if not isinstance(data, dict):
        raise PreflightError(
            "drafter_config",
            f"{path} holds a JSON {type(data).__name__}, not an object",
            "point drafter_config at the drafter's config.json",
        )
    return data


def _check_revision(revision: Optional[str]) -> None:
    """Refuse a revision that is no commit or ref name: it becomes a path under `refs/` and `snapshots/`."""
    if revision is not None and not (isinstance(revision, str) and _REVISION.match(revision)):
        raise PreflightError(
            "speculative_config.revision",
            f"{revision!r} is not a commit or a branch/tag name (letters, digits, `._-`, `/` between names; no "
            "`..`, no leading `/` or `.`)",
            "set revision to the drafter's 40-hex commit (or a branch or tag of its repo)",
        )


def _snapshot_dir(repo_dir: str, revision: Optional[str]) -> str:
    """The snapshot of a Hugging Face cache repo dir (`models--org--name`) that vLLM would load."""
    _check_revision(revision)
    snapshots = os.path.join(repo_dir, "snapshots")
    refs = os.path.join(repo_dir, "refs")
    ref_file = os.path.join(refs, revision or "main")
    if os.path.isfile(ref_file):
        # A ref is a file the cache wrote, naming a snapshot (its commit). Never follow one out of refs/, and
        # never show what one holds unless it names a snapshot: it may be another file's content.
        inside = os.path.realpath(ref_file).startswith(os.path.realpath(refs) + os.sep)
        try:
            with open(ref_file, "rb") as handle:
                commit = handle.read(128).decode("ascii").strip() if inside else ""
        except (OSError, UnicodeDecodeError):
            commit = ""
        if not (_SNAPSHOT_NAME.match(commit) and os.path.isdir(os.path.join(snapshots, commit))):
            raise PreflightError(
                "drafter_config",
                f"{ref_file} is not a Hugging Face cache ref naming one of its snapshots (a file in refs/ holding "
                "the commit of a directory in snapshots/)",
                "download the drafter again (`hf download <model> --revision <commit>`), or set "
                "speculative_config.revision to the snapshot's commit",
            )
        return os.path.join(snapshots, commit)
    if revision and os.path.isdir(os.path.join(snapshots, revision)):
        return os.path.join(snapshots, revision)
    found = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
    if len(found) == 1 and not revision:
        return os.path.join(snapshots, found[0])
    raise PreflightError(
        "drafter_config",
        f"cannot tell which snapshot of {repo_dir} to use (revision {revision or 'main'}, "
        f"snapshots: {', '.join(found) or 'none'})",
        "set speculative_config.revision to one of them, or point drafter_config at the snapshot directory",
    )


def locate_drafter_config(path: str, model_id: Optional[str] = None, revision: Optional[str] = None) -> str:
    """The drafter's config.json from a file, a model or snapshot dir, a cache repo dir or a cache root.

    A cache root (`~/.cache/huggingface` or its `hub/`) needs the model id, e.g. `z-lab/Qwen3.6-27B-DFlash`.
    """
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise PreflightError(
            "drafter_config",
            f"{path} does not exist on this host",
            "download the drafter first (e.g. `hf download <model>`) or correct the path",
        )
    if os.path.isfile(os.path.join(path, "config.json")):
        return os.path.join(path, "config.json")
    if os.path.basename(os.path.normpath(path)).startswith("models--"):
        return os.path.join(_snapshot_dir(path, revision), "config.json")
    if model_id and "/" in model_id and not os.path.isabs(model_id):
        repo_name = "models--" + model_id.replace("/", "--")
        for root in (path, os.path.join(path, "hub")):
            if os.path.isdir(os.path.join(root, repo_name)):
                return os.path.join(_snapshot_dir(os.path.join(root, repo_name), revision), "config.json")
    cached = f" and no cached {model_id} under it" if model_id else ""
    raise PreflightError(
        "drafter_config",
        f"no config.json in {path}{cached}",
        "point drafter_config at the drafter's config.json, its model directory or the Hugging Face cache holding it",
    )


def _from_speculators_format(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The HF config vLLM builds from a vllm-project/speculators DFlash checkpoint (speculators/algos.py)."""
    view = dict(config.get("transformer_layer_config") or {})
    aux_ids = config.get("aux_hidden_state_layer_ids")
    # Speculators name the aux hidden state (layer L's output is L + 1), DFlash names the layer L (vllm#40727).
    shifted = [i - 1 for i in aux_ids] if isinstance(aux_ids, list) and all(map(is_int, aux_ids)) else aux_ids
    view["architectures"] = ["DFlashDraftModel"]
    view["eagle_aux_hidden_state_layer_ids"] = aux_ids
    view["dflash_config"] = {
        "mask_token_id": config.get("mask_token_id"),
        "target_layer_ids": shifted,
        "causal": not config.get("sliding_window_non_causal", True),
    }
    for key in ("block_size", "num_target_layers"):
        view.setdefault(key, config.get(key))
    return view


def load_drafter_config(
    source: Any, model_id: Optional[str] = None, revision: Optional[str] = None
) -> Tuple[Dict[str, Any], Optional[str]]:
    """(the drafter's HF config as vLLM sees it, the file it was read from, or None for a dict)."""
    path: Optional[str] = None
    if isinstance(source, Mapping):
        config = dict(source)
    elif isinstance(source, str) and source:
        path = locate_drafter_config(source, model_id, revision)
        config = _read_json_object(path)
    else:
        raise PreflightError(
            "drafter_config",
            f"expected a path or a dict, got {type(source).__name__}",
            "pass the path of the drafter's config.json (or its directory), or the parsed dict",
        )
    if config.get("speculators_model_type") == "dflash":
        config = _from_speculators_format(config)
    return config, path


def dflash_needs_non_causal(drafter: Mapping[str, Any], honours_is_causal: bool = True) -> bool:
    """Whether any drafter layer is non-causal (dflash_has_any_non_causal of vLLM's qwen3_dflash.py).

    A top-level `is_causal` overrides every layer (vLLM 0.28+: `honours_is_causal`), then
    `dflash_config.causal`; otherwise only sliding-window layers are causal.
    """
    if honours_is_causal and drafter.get("is_causal") is not None:
        return not drafter["is_causal"]
    override = mapping(drafter.get("dflash_config")).get("causal")
    if override is not None:
        return not override
    layer_types = drafter.get("layer_types")
    layer_types = layer_types if isinstance(layer_types, list) else []
    num_layers = as_int(drafter.get("num_hidden_layers"))
    if num_layers is None:
        num_layers = max(len(layer_types), 1)
    return not all(i < len(layer_types) and layer_types[i] == SLIDING_ATTENTION for i in range(num_layers))
