# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""JSON from outside the collection (a drafter's config.json, a server's answer), parsed within limits.

`json.loads` recurses once per nesting level: `[[[[...` a hundred thousand deep ends in a RecursionError
(a traceback and "MODULE FAILURE", no message). The nesting is counted first, outside strings, so such a
document is refused with a ValueError like any other invalid JSON. Sizes are capped by the callers, which
read at most their cap. Neither error quotes the document: it may be a file the caller could read and the
operator could not. Standard library only.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "TooDeep", "loads"]

# A Hugging Face config nests 3 or 4 levels, an OpenAI answer 4 or 5; 64 leaves room and is far from the
# interpreter's recursion limit.
MAX_DEPTH = 64

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class TooDeep(ValueError):
    """A JSON document nested deeper than allowed."""


def _deeper_than(text: str, limit: int) -> bool:
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group(0) in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def loads(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads, refusing a document nested deeper than `max_depth` (TooDeep, a ValueError)."""
    if _deeper_than(text, max_depth):
        raise TooDeep(f"nested deeper than {max_depth} levels")
    return json.loads(text)
