# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One disk budget for a root: measure its parts and free the oldest first (vllm_build, vllm_release prune).

The parts that may go: a killed build's debris (build/<name>: first), the installer caches (cache/uv,
cache/pip), the compiler caches (cache/ccache, cache/sccache), the overlay's base wheel stubs
(cache/overlay/<x>), the git mirrors (src/<slug>.git), wheels and releases (with their wheels). Never what
serves (`current`), `previous`, the last good release or the one a rollback goes to (_releases.needed_releases),
never a path the caller protects (the mirror and release a build uses), never anything else under the root
(logs, state, tools) and never anything outside it: the walk never follows a symlink, and a part whose
directory leads out of the root is left out.

Bytes are allocated blocks (st_blocks), each inode counted once: uv hard-links its cache into every release, so
deleting cache/uv frees only what no release links. The plan is greedy, oldest first (the newest mtime in a
part: when it was last written), and counts what each part frees given the parts chosen before it.

Standard library only: this runs on the target host's system Python (3.8+).
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import linked_out
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import (
    LOCK_TIMEOUT,
    RELEASE_NAME,
    RELEASES_DIR,
    WHEELS_DIR,
    lock_for,
    needed_releases,
    remove_hidden_first,
    run_action_unlocked,
)

__all__ = ["GIB", "NEED_FACTOR", "Budget", "BudgetError", "Part", "Usage", "apply", "gib", "plan", "prune_within"]

GIB = 1024**3
# What a build needs, estimated: the newest release's size times this (its venv again, plus the checkout, the
# build's TMPDIR and the wheel, which go or stay small once it is done).
NEED_FACTOR = 1.5
# Under cache/: each directory one part of this kind.
_CACHES = {"uv": "uv_cache", "pip": "pip_cache", "ccache": "compile_cache", "sccache": "compile_cache"}
_NAMED = 3  # the biggest parts a failure names

Inode = Tuple[int, int]


class BudgetError(Exception):
    """The root does not fit its budget even with every part that may go freed; nothing was changed."""


class Part(NamedTuple):
    path: str
    kind: str  # release, wheels, mirror, build_debris, uv_cache, pip_cache, compile_cache, overlay
    release: Optional[str]  # the release name of a release or wheels part
    links: Dict[Inode, int]  # links of each inode inside the part
    size: int  # bytes of its inodes, each once (what it holds, shared or not)
    used_at: float  # the newest mtime in it


class Usage:
    """A measurement of one root: its bytes and its parts, those that may go and those that may not."""

    def __init__(
        self,
        root: str,
        releases: Sequence[str] = (),
        paths: Sequence[str] = (),
        warnings: Optional[List[str]] = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.warnings = warnings if warnings is not None else []
        needed, self.newest = needed_releases(self.root)
        self.needed = set(needed) | set(releases)
        self.protected_paths = {os.path.abspath(path) for path in paths}
        self.blocks: Dict[Inode, int] = {}  # bytes of every inode under the root
        self.nlink: Dict[Inode, int] = {}
        self.used_at: Dict[str, float] = {}
        self.parts: List[Part] = []  # those that may go
        self.kept: List[Part] = []  # the needed releases, their wheels, the protected paths (never freed)
        self.used = self._walk(self._tops())

    def _children(self, sub: str) -> List[str]:
        parent = os.path.join(self.root, sub)
        if os.path.islink(parent) or not os.path.isdir(parent):
            return []  # a linked releases/ (or cache/ ...) holds nothing of the root's own
        if linked_out(self.root, parent):
            self.warnings.append(f"{parent} leads out of {self.root}: the disk budget neither counts nor frees it")
            return []
        return sorted(name for name in os.listdir(parent) if not os.path.islink(os.path.join(parent, name)))

    def _tops(self) -> Dict[str, Tuple[str, Optional[str]]]:
        """The part directories: path -> (kind, release name)."""
        tops: Dict[str, Tuple[str, Optional[str]]] = {}
        for sub, kind in ((RELEASES_DIR, "release"), (WHEELS_DIR, "wheels")):
            for name in self._children(sub):
                path = os.path.join(self.root, sub, name)
                if RELEASE_NAME.match(name) and os.path.isdir(path):
                    tops[path] = (kind, name)
        for name in self._children("src"):
            if name.endswith(".git"):
                tops[os.path.join(self.root, "src", name)] = ("mirror", None)
        for name in self._children("build"):
            # Under the host lock no build runs: what is there is a killed build's, which the next build removes.
            tops[os.path.join(self.root, "build", name)] = ("build_debris", None)
        for name in self._children("cache"):
            if name in _CACHES:
                tops[os.path.join(self.root, "cache", name)] = (_CACHES[name], None)
        for name in self._children(os.path.join("cache", "overlay")):
            tops[os.path.join(self.root, "cache", "overlay", name)] = ("overlay", None)
        return tops

    def _walk(self, tops: Dict[str, Tuple[str, Optional[str]]]) -> int:
        """Walk the root once (lstat, no link followed); return its bytes, each inode once."""
        found: List[Part] = []
        if not os.path.isdir(self.root):
            return 0
        stack: List[Tuple[str, Optional[Part]]] = [(self.root, None)]
        self._count(os.lstat(self.root), None)
        while stack:
            directory, part = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # unreadable: what it holds is neither counted nor freed
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                inner = part
                if part is None and entry.path in tops:
                    kind, release = tops[entry.path]
                    inner = Part(entry.path, kind, release, {}, 0, 0.0)
                    found.append(inner)
                self._count(info, inner)
                if stat.S_ISDIR(info.st_mode):
                    stack.append((entry.path, inner))
        for part in sorted(found, key=lambda part: part.path):
            done = part._replace(size=sum(self.blocks[inode] for inode in part.links), used_at=self.used_at[part.path])
            kept = part.release in self.needed or part.path in self.protected_paths
            (self.kept if kept else self.parts).append(done)
        return sum(self.blocks.values())

    def _count(self, info: os.stat_result, part: Optional[Part]) -> None:
        inode = (info.st_dev, info.st_ino)
        blocks = getattr(info, "st_blocks", None)
        self.blocks[inode] = blocks * 512 if blocks is not None else info.st_size
        # A directory is never hard-linked: it goes with its part whatever its link count says.
        self.nlink[inode] = 1 if stat.S_ISDIR(info.st_mode) else info.st_nlink
        if part is not None:
            part.links[inode] = part.links.get(inode, 0) + 1
            self.used_at[part.path] = max(self.used_at.get(part.path, 0.0), info.st_mtime)

    def biggest(self) -> List[Part]:
        return sorted(self.parts + self.kept, key=lambda part: (-part.size, part.path))[:_NAMED]

    def estimate(self) -> Tuple[int, Optional[str]]:
        """What a build needs: the newest release's size times NEED_FACTOR (0 without a release to go by)."""
        for part in self.parts + self.kept:
            if part.kind == "release" and part.release == self.newest:
                return int(part.size * NEED_FACTOR), part.release
        return 0, None


def gib(value: int) -> str:
    """Bytes in words: GiB, or MiB below one."""
    return f"{value / GIB:.1f} GiB" if value >= GIB else f"{value / 1024**2:.1f} MiB"


class Budget:
    """The plan for one root and budget: the parts to free, oldest first, and what is left."""

    def __init__(self, usage: Usage, budget_gb: float, need: int, gone: Iterable[str], reference: Optional[str]):
        self.usage = usage
        self.budget_gb = budget_gb
        self.budget = int(budget_gb * GIB)
        self.need = need
        self.reference = reference
        self.gone = set(gone)
        self._links = dict(usage.nlink)  # links left of each inode once the chosen parts are gone
        self._wheels = {part.release: part for part in usage.parts if part.kind == "wheels"}
        self.chosen: List[Tuple[Part, int]] = []
        # What the caller's prune removes anyway first, then while over: a killed build's debris (the next build
        # removes it), then the oldest parts.
        self.take([part for part in usage.parts if part.release in self.gone])
        for part in sorted(usage.parts, key=lambda part: (part.kind != "build_debris", part.used_at, part.path)):
            if self.fits:
                break
            self.take([part])

    def take(self, parts: Iterable[Part]) -> None:
        """Choose `parts` (a release takes its wheels along: the release prune removes both), each freeing what
        no part left still links."""
        taken = {part.path for part, _freed in self.chosen}
        for part in parts:
            wheels = self._wheels.get(part.release) if part.kind == "release" else None
            for one in [part] + ([wheels] if wheels is not None else []):
                if one.path in taken:
                    continue
                freed = 0
                for inode, count in one.links.items():
                    self._links[inode] -= count
                    if self._links[inode] <= 0:
                        freed += self.usage.blocks[inode]
                self.chosen.append((one, freed))
                taken.add(one.path)

    @property
    def left(self) -> int:
        return self.usage.used - sum(freed for _part, freed in self.chosen)

    @property
    def fits(self) -> bool:
        return self.left + self.need <= self.budget

    @property
    def releases(self) -> List[str]:
        """The releases to free beyond those `gone`: the release prune's `drop`."""
        return [
            str(part.release) for part, _size in self.chosen if part.kind == "release" and part.release not in self.gone
        ]

    def check(self, what: str) -> None:
        """Raise BudgetError (nothing freed yet) when even every part that may go would not make it fit."""
        if self.fits:
            return
        usage = self.usage
        names = ", ".join(
            f"{part.path} ({part.kind}{', kept' if part in usage.kept else ''}, {gib(part.size)})"
            for part in usage.biggest()
        )
        basis = (
            f" (the newest release {self.reference}, {gib(int(self.need / NEED_FACTOR))}, times {NEED_FACTOR})"
            if self.reference
            else ""
        )
        raise BudgetError(
            f"{what} does not fit disk_budget_gb={self.budget_gb:g} ({gib(self.budget)}): {usage.root} uses "
            f"{gib(usage.used)} and needs {gib(self.need)} more{basis}; freeing every part that may go (never the "
            f"serving, last good or rollback release) leaves {gib(self.left)}. Nothing was changed. Fix: free "
            f"space under {usage.root} - the biggest parts are {names or 'none'} - or raise disk_budget_gb"
        )

    def free(self) -> None:
        """Remove the chosen parts that are not releases (the caller's release prune removes those with
        their wheels: run it with `drop=releases` first)."""
        dropped = set(self.releases) | self.gone
        for part, _freed in self.chosen:
            if part.kind == "release" or (part.kind == "wheels" and part.release in dropped):
                continue
            remove_hidden_first(part.path)  # a rename first: no half cache or mirror is ever seen

    def result(self) -> Dict[str, Any]:
        return {
            "budget_bytes": self.budget,
            "need_bytes": self.need,
            "used_bytes_before": self.usage.used,
            "used_bytes_after": self.left,
            "freed": [{"path": part.path, "kind": part.kind, "bytes": freed} for part, freed in self.chosen],
            "kept": sorted(self.usage.needed),
            "fits": self.fits,
        }


def plan(
    root: str,
    budget_gb: float,
    *,
    need: Optional[int] = None,
    releases: Sequence[str] = (),
    paths: Sequence[str] = (),
    gone: Sequence[str] = (),
    warnings: Optional[List[str]] = None,
) -> Budget:
    """Measure `root` and plan what to free so that its bytes plus `need` fit `budget_gb` (under the host lock).

    `need` None: a build's, estimated from the newest release; 0: a prune's. `releases` and `paths` are never
    freed (the release a build made, the mirror it reads). `gone`: releases the caller's prune removes anyway.
    """
    usage = Usage(root, releases, paths, warnings)
    reference = None
    if need is None:
        need, reference = usage.estimate()
    return Budget(usage, budget_gb, need, gone, reference)


def apply(budget: Budget, keep_releases: int, what: str, check_mode: bool, strict: bool = True) -> Dict[str, Any]:
    """Check the plan (BudgetError when it cannot fit; `strict` False: free what may go all the same), then free it
    unless in check mode: the releases through the release prune (state.json forgets them, their wheels go along),
    then the other parts. The `disk` result."""
    if strict:
        budget.check(what)
    if not check_mode:
        if budget.releases:
            pruned = run_action_unlocked(
                budget.usage.root, "prune", keep_releases=keep_releases, protect=sorted(budget.usage.needed),
                drop=budget.releases,
            )["pruned"]  # fmt: skip
            # The prune also removes failed releases and unfinished ones: freed too.
            budget.take([part for part in budget.usage.parts if part.kind == "release" and part.release in pruned])
        budget.free()
    return budget.result()


def prune_within(
    root: str, keep_releases: int, budget_gb: float, check_mode: bool = False, lock_timeout: float = LOCK_TIMEOUT
) -> Dict[str, Any]:
    """vllm_release's prune with a disk budget, under the host lock: the releases beyond `keep_releases` go,
    then the oldest parts while the root is over the budget. The release prune's result with `disk` added."""
    read_only = check_mode or not os.path.isdir(root)
    with lock_for(root, read_only, lock_timeout):
        warnings: List[str] = []
        coming = run_action_unlocked(root, "prune", keep_releases=keep_releases, check_mode=True)["pruned"]
        budget = plan(root, budget_gb, need=0, gone=coming, warnings=warnings)
        budget.check(f"{root} after the prune")
        done = run_action_unlocked(
            root, "prune", keep_releases=keep_releases, check_mode=check_mode, drop=budget.releases
        )
        if not check_mode:
            budget.free()
    disk = budget.result()
    done["disk"] = disk
    done["changed"] = done["changed"] or bool(disk["freed"])
    done["warnings"] = done["warnings"] + warnings
    return done
