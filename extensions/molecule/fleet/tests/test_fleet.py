"""Two hosts, one build: the canary builds and serves first, the other installs the copied wheel."""

from __future__ import annotations

import json

import testinfra

HOSTS = {name: testinfra.get_host(f"podman://{name}") for name in ("gpu1", "gpu2")}


def _manifest(host) -> dict:
    return json.loads(host.file("/opt/vllm/current/manifest.json").content_string)


def _state(host) -> dict:
    return json.loads(host.file("/opt/vllm/state.json").content_string)


def test_one_build_for_the_fleet():
    sources = {name: _manifest(h)["source"] for name, h in HOSTS.items()}
    assert sorted(sources.values()) == ["build", "wheel"], sources


def test_same_commit_and_release_everywhere():
    manifests = [_manifest(h) for h in HOSTS.values()]
    assert manifests[0]["commit"] == manifests[1]["commit"]
    assert manifests[0]["name"] == manifests[1]["name"]
    assert manifests[0]["wheel"]["sha256"] == manifests[1]["wheel"]["sha256"]


def _first(host, action: str) -> str:
    return next(e["at"] for e in _state(host)["history"] if e["action"] == action)


def test_canary_first():
    # the canary (batch 1) passed its gate before the second batch activated anything
    assert _first(HOSTS["gpu1"], "mark_good") <= _first(HOSTS["gpu2"], "activate")


def test_both_serve_and_passed_the_gate():
    for host in HOSTS.values():
        assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0
        report = json.loads(host.file("/var/lib/vllm-gate/default.json").content_string)
        assert report["passed"] is True
