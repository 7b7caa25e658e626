"""pyproject_hooks 1.3.3 (https://github.com/pypa/pyproject-hooks): `_in_process/_in_process.py` only.

Copied unchanged from pyproject_hooks-1.3.3-py3-none-any.whl
(sha256 5fc53fdac9f7bd63fbcdc868fb5f90b4784d78a53a3d3388cd738b807441a20b), pyproject_hooks/_in_process/.
It is the standard-library script pip and build run in the build environment to call a backend's hooks;
_pep517 writes its text there and calls two of its hooks in one process. Licence: LICENSE (MIT).
"""

__version__ = "1.3.3"
