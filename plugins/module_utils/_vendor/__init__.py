# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Third-party code vendored as ansible-core vendors it: unchanged but for its imports and one
`# pylint: disable=` line per file (ansible-test's pylint; ansible-lint admits no ignore file for it),
under its own licence.

Modules run on the target's system python, which may lack these libraries. Each package here names its
upstream version and the sha256 of the sdist it was copied from; update by copying again, not by editing.
"""
