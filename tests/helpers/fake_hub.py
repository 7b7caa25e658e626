"""TEST EQUIPMENT: a local server speaking the part of the Hugging Face Hub HTTP API that
`huggingface_hub.snapshot_download` (and `HfApi.repo_info` / `list_repo_tree`) use at a revision.

The hub is unreachable from the machines this collection is tested on; point `HF_ENDPOINT` at this server
instead. It serves models the tests make (a `config.json` and a small binary stored as LFS), nothing else.
Routes (model repos only):

- `GET /api/models/{repo}/revision/{rev}`: model info, `sha` (the commit) and `siblings`
- `GET /api/models/{repo}/tree/{rev}[/{path}]`: the file listing with `oid` (git blob sha1), `size` and, for an
  LFS file, `lfs: {oid: <sha256>, size, pointerSize}`
- `HEAD|GET /{repo}/resolve/{rev}/{file}`: the file, with `X-Repo-Commit`, `ETag` (the blob sha1, or the sha256
  of an LFS file), `X-Linked-Etag` / `X-Linked-Size` for LFS files, and `Content-Length`

An unknown repo, revision or file answers 404 with the hub's `X-Error-Code` (`RepoNotFound`,
`RevisionNotFound`, `EntryNotFound`). `tamper` serves other bytes than the listing describes (a corrupted
mirror or a man in the middle) so tests can check that staging refuses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Iterator, Optional, Set, Tuple
from urllib.parse import unquote, urlsplit


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a file: what the hub lists as `oid` (and ETag) of a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(content: bytes) -> bytes:
    return b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (
        hashlib.sha256(content).hexdigest().encode(),
        len(content),
    )


@dataclass
class FakeRepo:
    commits: Dict[str, Dict[str, bytes]] = field(default_factory=dict)  # commit -> path -> content
    refs: Dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    lfs: Set[str] = field(default_factory=set)  # paths stored as LFS
    tamper: Dict[Tuple[str, str], bytes] = field(default_factory=dict)  # (commit, path) -> bytes served instead

    def resolve(self, revision: str) -> Optional[str]:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


class FakeHub:
    def __init__(self) -> None:
        self.repos: Dict[str, FakeRepo] = {}
        self.requests: list = []  # (method, path, had Authorization header)
        self.downloads: Dict[str, int] = {}  # path -> GETs of a file (not HEADs)

    def add_commit(
        self, repo_id: str, files: Dict[str, bytes], lfs: Tuple[str, ...] = (), ref: Optional[str] = "main"
    ) -> str:
        """Add a commit of `files` to `repo_id` (made if new); `ref` then points at it. Returns the commit."""
        repo = self.repos.setdefault(repo_id, FakeRepo())
        digest = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(c).hexdigest()) for p, c in files.items())).encode())
        commit = hashlib.sha1(repo_id.encode() + digest.digest() + str(len(repo.commits)).encode()).hexdigest()
        repo.commits[commit] = dict(files)
        repo.lfs.update(lfs)
        if ref:
            repo.refs[ref] = commit
        return commit

    # --- what the hub answers -------------------------------------------------------------------------------
    def tree(self, repo: FakeRepo, commit: str) -> list:
        entries = []
        for path, content in sorted(repo.commits[commit].items()):
            entry = {"type": "file", "path": path, "size": len(content)}
            if path in repo.lfs:
                pointer = lfs_pointer(content)
                entry["oid"] = git_blob_sha1(pointer)
                entry["lfs"] = {
                    "oid": hashlib.sha256(content).hexdigest(),
                    "size": len(content),
                    "pointerSize": len(pointer),
                }
            else:
                entry["oid"] = git_blob_sha1(content)
            entries.append(entry)
        return entries

    def split(self, route: str) -> Optional[Tuple[str, FakeRepo, str]]:
        """`org/name/<rest>` -> (repo_id, repo, rest) for a known repo."""
        parts = route.split("/", 2)
        if len(parts) < 2:
            return None
        repo_id = "/".join(parts[:2])
        repo = self.repos.get(repo_id)
        if repo is None:
            return None
        return repo_id, repo, parts[2] if len(parts) > 2 else ""


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeHub/1"
    hub: FakeHub

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _send(self, code: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _not_found(self, code: str) -> None:
        body = json.dumps({"error": code}).encode()
        self._send(404, body, {"X-Error-Code": code, "X-Error-Message": code, "Content-Type": "application/json"})

    def _json(self, data) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _route(self) -> None:
        hub = self.hub
        path = unquote(urlsplit(self.path).path)
        hub.requests.append((self.command, path, "Authorization" in self.headers))
        if path.startswith("/api/models/"):
            found = hub.split(path[len("/api/models/") :])
            if found is None:
                return self._not_found("RepoNotFound")
            repo_id, repo, rest = found
            kind, _sep, tail = rest.partition("/")
            revision, _sep, sub = tail.partition("/")
            commit = repo.resolve(revision)
            if kind not in ("revision", "tree"):
                return self._not_found("EntryNotFound")
            if commit is None:
                return self._not_found("RevisionNotFound")
            if kind == "revision":
                siblings = [{"rfilename": p} for p in sorted(repo.commits[commit])]
                return self._json({"id": repo_id, "modelId": repo_id, "sha": commit, "siblings": siblings})
            entries = [e for e in hub.tree(repo, commit) if not sub or e["path"].startswith(sub.rstrip("/") + "/")]
            return self._json(entries)
        found = hub.split(path.lstrip("/"))
        if found is None:
            return self._not_found("RepoNotFound")
        repo_id, repo, rest = found
        kind, _sep, tail = rest.partition("/")
        revision, _sep, file_path = tail.partition("/")
        if kind != "resolve":
            return self._not_found("EntryNotFound")
        commit = repo.resolve(revision)
        if commit is None:
            return self._not_found("RevisionNotFound")
        if file_path not in repo.commits[commit]:
            return self._not_found("EntryNotFound")
        listed = repo.commits[commit][file_path]
        body = repo.tamper.get((commit, file_path), listed)
        headers = {"X-Repo-Commit": commit, "Content-Type": "application/octet-stream"}
        if file_path in repo.lfs:
            sha256 = hashlib.sha256(listed).hexdigest()
            headers.update({"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(body))})
        else:
            headers["ETag"] = f'"{git_blob_sha1(listed)}"'
        if self.command == "GET":
            hub.downloads[f"{repo_id}/{file_path}"] = hub.downloads.get(f"{repo_id}/{file_path}", 0) + 1
        self._send(200, body, headers)


@contextlib.contextmanager
def serve(hub: FakeHub) -> Iterator[str]:
    """Serve `hub` on a free loopback port; yields the endpoint URL (for `HF_ENDPOINT`)."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
