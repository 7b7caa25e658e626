# This file is dual licensed under the terms of the Apache License, Version
# 2.0, and the BSD License. See the LICENSE file in the root of this repository
# for complete details.
"""packaging 24.2 (https://github.com/pypa/packaging): `version`, `tags`, `utils` and what they import.

Copied from packaging-24.2.tar.gz (sha256 c228a6dc5e932d346bc5739379109d49e8853dd8223571c7c5b55260edc0b97f),
src/packaging/{version,_structures,tags,_manylinux,_musllinux,_elffile,utils}.py; the last release for
Python 3.8. Changed, each marked `vendored:`: relative imports made absolute (Ansible's module packer
follows absolute collection imports), and the asserts ansible-test sanity's no-assert refuses: one that
cannot fire dropped (version.py), one turned into the raise of the AssertionError its `except` catches
(_manylinux.py), and _musllinux.py's `__main__` self-check dropped. Licence: LICENSE (BSD-2-Clause or
Apache-2.0, LICENSE.BSD / LICENSE.APACHE).
"""

__version__ = "24.2"
