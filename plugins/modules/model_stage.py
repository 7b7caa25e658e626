#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_stage
short_description: Stage pinned models into the Hugging Face cache the server reads, verified file by file
description:
  - Stages each of O(models) - a Hugging Face repo id at a revision - into O(cache_dir) in
    C(huggingface_hub)'s cache layout, C(<cache_dir>/models--<org>--<name>/snapshots/<commit>/), before the
    server is restarted, so that a server with C(HF_HUB_OFFLINE=1) loads exactly these files and never fetches.
  - The revision must be a 40-hex commit; a branch or tag is refused unless the model sets
    O(models[].allow_moving_revision), and the result then flags it (C(moving_revision)).
  - Source V(hub) runs C(huggingface_hub.snapshot_download(repo_id, revision=<commit>, allow_patterns=...,
    cache_dir=...)) in O(python) (the release venv's python - vLLM depends on C(huggingface_hub); the module itself
    needs only the standard library). Every file is then checked against the hub's listing for that commit - the
    LFS sha256 of a file stored in LFS, the git blob sha1 of a file stored in git. An unknown repo or revision is
    refused before anything is downloaded; a file that does not match is removed from the cache and refused,
    naming repo, revision and file.
  - Source V(path) copies a directory on the host (air-gapped hosts) into the same layout, named by
    O(models[].revision), each file checked against O(models[].checksums) when given.
  - The verdict is written to O(record) - a C(files) map of every snapshot file to its sha256, and per model its
    repo, revision, commit and snapshot - the form M(vllm_ops.dflash.vllm_drift)'s C(recorded_inputs) reads, so
    the deploy's look sees a file changed in place.
version_added: 0.2.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
attributes:
  check_mode:
    support: full
    details:
      - Asks the hub for the listing and hashes what is already staged; downloads, copies and writes nothing.
  diff_mode:
    support: full
    details:
      - The record before and after.
  idempotent:
    support: full
options:
  models:
    description: The models to stage (for example the target and the drafter).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - Name of the model in the result and the record (for example C(target), C(drafter)).
          - Default O(models[].repo_id).
        type: str
      repo_id:
        description: Hugging Face repo id, C(org/name).
        type: str
        required: true
      revision:
        description: The commit to serve (40 hex). A branch or tag only with O(models[].allow_moving_revision).
        type: str
        required: true
      allow_moving_revision:
        description: Accept a branch or tag; it is resolved to its commit now and the result flags C(moving_revision).
        type: bool
        default: false
      source:
        description: Where the files come from.
        type: str
        choices: [hub, path]
        default: hub
      path:
        description:
          - With O(models[].source=path), the directory on the host that holds the files of that revision.
          - Only regular files inside it that others may read are staged (the staged blobs are 0644); a link
            out of it, a link to a directory, a device or FIFO, or a file of mode C(0600) is refused, naming
            the file, before anything is staged.
        type: path
      allow_patterns:
        description: Only files matching one of these (C(fnmatch), as C(huggingface_hub)); empty stages all files.
        type: list
        elements: str
      checksums:
        description:
          - With O(models[].source=path), the sha256 each named file must have (for example from the record of
            a connected host).
        type: dict
  cache_dir:
    description: The Hugging Face cache the server reads (C(HF_HOME)/hub of the unit).
    type: path
    required: true
  record:
    description: Where to write the verdict (for example C(/etc/vllm/<instance>.models.json)); not written when omitted.
    type: path
  python:
    description: A python that has C(huggingface_hub), for O(models[].source=hub) (the release venv's python).
    type: path
  hf_token:
    description: Token for private or gated repos; passed to the staging script in its environment only.
    type: str
  hf_endpoint:
    description: C(HF_ENDPOINT) of the staging script (a mirror; the tests' local hub). Default the hub's own.
    type: str
  timeout:
    description: Seconds one model's listing or download may take.
    type: float
    default: 3600
notes:
  - Runs on the target with its system Python and the standard library only; the hub is asked by a script run
    in O(python).
  - Every staged file is hashed on every run (a re-run of a 16 GB model reads 16 GB); nothing is downloaded again
    when it matches.
seealso:
  - module: vllm_ops.dflash.dflash_preflight
  - module: vllm_ops.dflash.vllm_drift
"""

EXAMPLES = r"""
- name: Stage the target and the drafter at pinned commits
  vllm_ops.dflash.model_stage:
    models:
      - name: target
        repo_id: Qwen/Qwen3-8B
        revision: b968826d9c46dd6066d109eabc6255188de91218
        allow_patterns: ["*.json", "*.safetensors", "tokenizer*", "*.txt"]
      - name: drafter
        repo_id: z-lab/Qwen3-8B-DFlash-b16
        revision: 4c1d2a0f6e9b8d7c6a5b4e3d2c1b0a9f8e7d6c5b
    cache_dir: /var/lib/vllm/huggingface/hub
    python: /opt/vllm/releases/3cfc8f8b7a1b-1a2b3c4d/venv/bin/python
    hf_token: "{{ vllm_hf_token }}"
    record: /etc/vllm/default.models.json

- name: Stage from a directory copied to an air-gapped host
  vllm_ops.dflash.model_stage:
    models:
      - name: drafter
        repo_id: z-lab/Qwen3-8B-DFlash-b16
        revision: 4c1d2a0f6e9b8d7c6a5b4e3d2c1b0a9f8e7d6c5b
        source: path
        path: /srv/models/qwen3-8b-dflash
        checksums:
          model.safetensors: 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
    cache_dir: /var/lib/vllm/huggingface/hub
"""

RETURN = r"""
models:
  description: Per model name, what was staged.
  returned: success
  type: dict
  contains:
    repo_id:
      description: The repo id.
      type: str
      returned: success
    revision:
      description: The revision as given.
      type: str
      returned: success
    commit:
      description: The commit staged (the revision resolved by the hub, or the revision of a path source).
      type: str
      returned: success
    moving_revision:
      description: Whether the revision was a branch or tag (accepted by O(models[].allow_moving_revision)).
      type: bool
      returned: success
    source:
      description: V(hub) or V(path).
      type: str
      returned: success
    snapshot:
      description: The snapshot directory to serve (C(model:) / C(speculative_config.model)).
      type: str
      returned: success
      sample: /var/lib/vllm/huggingface/hub/models--org--name/snapshots/4c1d2a0f6e9b8d7c6a5b4e3d2c1b0a9f8e7d6c5b
    files:
      description:
        - Per file of the snapshot, C(sha256), C(size) and C(verified_by) (what it was checked against).
        - Empty in check mode before staging.
      type: dict
      returned: success
    changed:
      description: Whether this model was downloaded or copied (in check mode, would be).
      type: bool
      returned: success
record:
  description: The record path (O(record)).
  returned: success
  type: str
record_changed:
  description: Whether the record was (in check mode, would be) rewritten.
  returned: success
  type: bool
changed:
  description: Whether a model was staged or the record rewritten.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._models import ModelSpec, StageError, stage_models


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "models": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "name": {"type": "str"},
                    "repo_id": {"type": "str", "required": True},
                    "revision": {"type": "str", "required": True},
                    "allow_moving_revision": {"type": "bool", "default": False},
                    "source": {"type": "str", "choices": ["hub", "path"], "default": "hub"},
                    "path": {"type": "path"},
                    "allow_patterns": {"type": "list", "elements": "str"},
                    "checksums": {"type": "dict"},
                },
            },
            "cache_dir": {"type": "path", "required": True},
            "record": {"type": "path"},
            "python": {"type": "path"},
            "hf_token": {"type": "str", "no_log": True},
            "hf_endpoint": {"type": "str"},
            "timeout": {"type": "float", "default": 3600},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        specs = [ModelSpec.from_option(item) for item in params["models"]]
        if any(spec.source == "hub" for spec in specs) and not params["python"]:
            raise StageError(
                "a hub source needs python. Fix: set python to the release venv's python (it has huggingface_hub)."
            )
        env = dict(os.environ)
        env.pop("HF_TOKEN", None)
        if params["hf_token"]:
            env["HF_TOKEN"] = params["hf_token"]
        if params["hf_endpoint"]:
            env["HF_ENDPOINT"] = params["hf_endpoint"]
        result = stage_models(
            specs,
            params["cache_dir"],
            record=params["record"],
            python=params["python"] or "",
            env=env,
            timeout=params["timeout"],
            check_mode=module.check_mode,
        )
    except StageError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(
            msg=f"model_stage could not write {exc.filename}: {exc.strerror}. Fix: run as a user that may write there."
        )
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
