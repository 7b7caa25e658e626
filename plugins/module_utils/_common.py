# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small shared helpers: atomic JSON files, UTC timestamps, file hashes, URL redaction, the secret-name rule.

Standard library only: this runs on the target host's system Python (3.8+).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.request
from typing import Any

__all__ = [
    "linked_out",
    "open_private_append",
    "read_json",
    "redact_url",
    "remove_tree_within",
    "secret_name",
    "sha256_file",
    "sha256_stream",
    "utc_now",
    "write_json_atomic",
    "write_text_atomic",
]

CHUNK = 1 << 20  # what a streamed hash reads at a time
# scheme://user[:password]@host...  -> the userinfo part is a secret (tokens travel there).
# Not anchored: the same pattern cleans URLs inside error messages and log lines.
_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^@/?#\s'\"`]*)@")
# The one rule for every module that judges whether a variable's name says its value is a credential.
# Substrings, not whole `_`-separated words: HFTOKEN, OPENAI_APIKEY, DB_PASS, MY_CREDENTIALS are secrets.
# The exceptions are names whose values are paths or short words that masking would hide everywhere in the
# output: TOKENIZER (TOKENIZERS_PARALLELISM=false), PAT only as a word (GITHUB_PAT, not PATH), PWD only
# after a separator (DB_PWD, not the shell's PWD or OLDPWD).
_SECRET_NAME = re.compile(
    r"TOKEN(?!IZER)|KEY|SECRET|PASS|(?<=[_-])PWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|(?<![A-Z0-9])PAT(?![A-Z0-9])",
    re.IGNORECASE,
)


def secret_name(name: str) -> bool:
    """Whether a variable's name (an env key, a build_env key, an option) says its value is a credential."""
    return bool(_SECRET_NAME.search(str(name)))


def linked_out(root: str, path: str) -> bool:
    """Whether `path` (inside `root` by name) really lies outside `root`: a link on its way leads out."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep)


def remove_tree_within(root: str, path: str) -> bool:
    """Delete the tree `path` under `root`, never following a link out of `root`.

    A symlink at `path` is removed itself, never what it points to; a `path` whose parent resolves outside
    `root` (a linked `build/` or `releases/`) is left alone. Returns whether nothing is left at `path`.
    """
    if not os.path.lexists(path):
        return True
    if linked_out(root, os.path.dirname(os.path.abspath(path))):
        return False
    if os.path.islink(path):
        os.unlink(path)
        return True
    shutil.rmtree(path, ignore_errors=True)  # its own inner links are unlinked, not followed
    return not os.path.lexists(path)


def open_private_append(path: str) -> Any:
    """`path` opened for appending in binary, 0600 from its creation (and made 0600 if it was wider): logs
    that a tool may echo a credential into are never readable by other local users."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def write_json_atomic(path: str, data: Any, mode: int = 0o644) -> None:
    """Write `data` as JSON to `path` atomically (see write_text_atomic)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)


def write_text_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` (`mode`) so that readers see the old file or the new one, never a half.

    The temporary file lives in the same directory (rename is atomic only within one file system)
    and is fsynced before the rename so a power loss cannot leave an empty file behind.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # mkstemp made it 0600: it is never wider than `mode` on its way
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a directory
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: str, default: Any = None) -> Any:
    """Return the parsed JSON of `path`, or `default` when the file does not exist.

    A file that exists but is not valid JSON raises ValueError naming the file: silently treating a
    corrupt state file as empty would lose the release history.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return default
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or remove the file") from exc


def utc_now() -> str:
    """Current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (the timestamp format of manifest.json and state.json)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256_stream(source: Any, copy_to: Any = None, also: Any = ()) -> Any:
    """The sha256 (a hashlib object) of what the binary file `source` holds, read in chunks (wheels and
    model files run to gigabytes). Each chunk is also written to `copy_to` and fed to the hashes in `also`,
    so a copy or a second hash costs no second read."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: source.read(CHUNK), b""):
        digest.update(chunk)
        for other in also:
            other.update(chunk)
        if copy_to is not None:
            copy_to.write(chunk)
    return digest


def sha256_file(path: str) -> str:
    """Hex sha256 of a file's content."""
    with open(path, "rb") as handle:
        return str(sha256_stream(handle).hexdigest())


def redact_url(url: str) -> str:
    """`url` (or any text containing URLs) with user/password/token removed from authority parts.

    `https://user:token@host/x.git` -> `https://host/x.git`. scp-like ssh addresses (`git@host:x.git`)
    local paths and an ssh user name without a password (`ssh://git@host/x.git`) carry no secret and
    are returned unchanged.
    """

    def strip(match: re.Match) -> str:
        scheme, userinfo = match.group("scheme"), match.group("userinfo")
        if "ssh" in scheme.lower() and ":" not in userinfo:
            return match.group(0)
        return scheme

    return _URL_USERINFO.sub(strip, url)


class NoRedirectHandler(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: the 3xx comes back as an HTTPError (whose Location the caller can name).

    vLLM answers /health, /metrics, /version and /v1/* itself and never redirects them. A redirect means
    something else answers at the URL (a proxy, a login page, another host): following it would send the
    api_key there, or judge that host's counters or health, and even a same-origin redirect would look at
    another path than the one asked for. So neither the gate nor the look follows one.
    """

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None
