"""Print the deploy's summary (one line per host) from a `molecule converge` log, as the last output.

`make demo` tees molecule's output to a log and ends with this: molecule's own recap would otherwise be
the last thing a user reads. The play and task are found by the names they have in deploy_dflash.yml.
Exits 1, naming the log, when the log holds no summary line (the demo then fails instead of hiding it).

    python tests/tools/demo_summary.py LOG
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List, Sequence

import yaml

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "deploy_dflash.yml"
# `ok: [localhost] => (item=gpu1) =>` then the result: an indented YAML block (callback_result_format:
# yaml) or, with the default format, JSON on the same line.
RESULT = re.compile(r"^ok: \[[^\]]+\] => \(item=[^)]*\) =>\s*(?P<json>\{.*\})?\s*$")
HEADER = re.compile(r"^(PLAY|TASK) \[(?P<name>.*)\] \**\s*$")


def summary_names(playbook: Path = PLAYBOOK) -> tuple:
    """The deploy's last play (the summary) and its task, as the log names them."""
    last = yaml.safe_load(playbook.read_text())[-1]
    return last["name"], last["tasks"][0]["name"]


def summary_lines(log: str, playbook: Path = PLAYBOOK) -> List[str]:
    play_name, task_name = summary_names(playbook)
    lines = log.splitlines()
    found: List[str] = []
    play = task = ""
    index = 0
    while index < len(lines):
        header = HEADER.match(lines[index])
        if header:
            kind, name = lines[index].split(" ", 1)[0], header.group("name")
            play, task = (name, "") if kind == "PLAY" else (play, name)
            if (play, task) == (play_name, task_name):
                found = []  # a log of several converges: the last one's
        elif (play, task) == (play_name, task_name) and RESULT.match(lines[index]):
            inline = RESULT.match(lines[index]).group("json")
            block = []
            while index + 1 < len(lines) and lines[index + 1].startswith(" "):
                index += 1
                block.append(lines[index])
            result = json.loads(inline) if inline else yaml.safe_load("\n".join(block)) or {}
            if isinstance(result, dict) and result.get("msg"):
                found.append(" ".join(str(result["msg"]).split()))
        index += 1
    return found


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    log = Path(argv[0])
    found = summary_lines(log.read_text(errors="replace"))
    if not found:
        print(f"demo: no deploy summary line in {log} (see the output above)", file=sys.stderr)
        return 1
    print("\nDeploy summary (one line per host):")
    for line in found:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
