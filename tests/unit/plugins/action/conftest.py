"""Action plugins look plugins up by FQCN (ansible.builtin.template, this collection's filters): that needs
Ansible's collection finder, which ansible-playbook installs and plain pytest does not. Installed for these tests
only, and removed with what it imported: the other tests import the collection from sys.path, which the finder
would refuse. The collection imported that way is set aside meanwhile, so that the finder loads its plugins."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

COLLECTIONS = Path(__file__).resolve().parents[4] / ".cache" / "ac"


@pytest.fixture(autouse=True)
def collection_finder() -> Iterator[None]:
    imported = {name: module for name, module in sys.modules.items() if name.startswith("ansible_collections")}
    for name in imported:
        del sys.modules[name]
    _AnsibleCollectionFinder(paths=[str(COLLECTIONS)])._install()
    try:
        yield
    finally:
        _AnsibleCollectionFinder._remove()
        for name in [name for name in sys.modules if name.startswith("ansible_collections")]:
            del sys.modules[name]
        sys.modules.update(imported)
