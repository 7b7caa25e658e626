"""Action plugins look plugins up by FQCN (ansible.builtin.template): that needs Ansible's collection finder,
which ansible-playbook installs and plain pytest does not."""

from __future__ import annotations

from pathlib import Path

from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

COLLECTIONS = Path(__file__).resolve().parents[4] / ".cache" / "ac"
_AnsibleCollectionFinder(paths=[str(COLLECTIONS)])._install()
