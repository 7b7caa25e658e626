# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The script that asks the Hugging Face Hub, run in a python that has `huggingface_hub` (the release venv's:
vLLM depends on it). Modules stay standard library only; this text is written to a temporary file and run.

Protocol: one JSON request on stdin, one JSON answer on stdout (the last line).
Request: {"repo_id", "revision", "allow_patterns" (list or null), "cache_dir", "download" (bool)}.
Answer: {"commit", "snapshot", "listing": {path: {"size", "sha256" (LFS oid or null), "git_sha1"}}} or
{"error": "repo_not_found|revision_not_found|unauthorized|unreachable|no_huggingface_hub|other", "message"}.
The token comes from the environment (HF_TOKEN), never from argv or the request.
"""

from __future__ import annotations

__all__ = ["STAGE_SCRIPT"]

STAGE_SCRIPT = r"""
import json
import sys


def answer(data):
    sys.stdout.write("\n" + json.dumps(data) + "\n")
    sys.stdout.flush()


def main():
    request = json.loads(sys.stdin.read())
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.utils import filter_repo_objects
    except ImportError as exc:
        return answer({"error": "no_huggingface_hub", "message": str(exc)})
    try:
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError
    except ImportError:  # huggingface_hub < 0.23
        from huggingface_hub.utils import RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError
    repo_id, revision = request["repo_id"], request["revision"]
    patterns = request.get("allow_patterns") or None
    api = HfApi()
    try:
        commit = api.repo_info(repo_id, revision=revision).sha
        listing = {}
        entries = api.list_repo_tree(repo_id, revision=commit, recursive=True)
        files = [entry for entry in entries if getattr(entry, "blob_id", None) is not None]
        for entry in filter_repo_objects(files, allow_patterns=patterns, key=lambda entry: entry.path):
            lfs = getattr(entry, "lfs", None)
            listing[entry.path] = {
                "size": entry.size,
                "sha256": lfs.sha256 if lfs is not None else None,
                "git_sha1": entry.blob_id,
            }
        snapshot = None
        if request.get("download"):
            snapshot = snapshot_download(
                repo_id, revision=commit, allow_patterns=patterns, cache_dir=request["cache_dir"]
            )
    except RevisionNotFoundError as exc:
        return answer({"error": "revision_not_found", "message": str(exc).splitlines()[0]})
    except RepositoryNotFoundError as exc:
        return answer({"error": "repo_not_found", "message": str(exc).splitlines()[0]})
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        kind = "unauthorized" if status in (401, 403) else "other"
        return answer({"error": kind, "message": str(exc).splitlines()[0]})
    except (OSError, ValueError) as exc:
        return answer({"error": "unreachable", "message": "%s: %s" % (type(exc).__name__, exc)})
    except Exception as exc:  # httpx/requests connection errors differ between huggingface_hub versions
        return answer({"error": "unreachable", "message": "%s: %s" % (type(exc).__name__, exc)})
    answer({"commit": commit, "snapshot": snapshot, "listing": listing})


main()
"""
