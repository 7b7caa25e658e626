import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "shared"))
# tests/helpers (as `helpers`), the home of what the unit tests share with these verifiers
sys.path.insert(0, str(HERE.parents[4] / "tests"))
