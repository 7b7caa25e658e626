"""Wait for a condition in a test without guessing how fast the machine is.

One home for the unit tests (`tests/` is on sys.path through tests/conftest.py) and the molecule
verifiers (their conftest.py puts `tests/` on sys.path): both import it as `helpers.polling`.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0, most: float = 0.5) -> Any:
    """Poll `condition` until it returns something true and return that; the bound is generous, never a guess
    at speed. The pause starts at 50 ms (a local process answers at once) and doubles up to `most` seconds, so
    a costly probe (a command run in a container) is not repeated back to back."""
    deadline = time.monotonic() + timeout
    pause = min(0.05, most)
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(pause)
        pause = min(pause * 2, most)
