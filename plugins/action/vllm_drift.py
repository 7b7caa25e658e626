# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_drift's controller side: render the files a deploy would write, hash them, one remote call.

The deploy's look used to render and hash each role's files in tasks of their own (set_fact per role, per
host) before the module ran: every per-host task costs the controller a worker, and the look cost each host
0.70-0.84 s of controller CPU against a ping's 0.06 s (bench/README.md). Here the renders happen in the one
task's worker, with the same lookup the roles' expected_files use (`ansible.builtin.template`: the same
bytes, the same ansible_managed and template_* variables), and only path, sha256 and mode reach the host:
the environment file's secrets never leave the controller. `refusals` are the roles' own checks, made first:
a message fails the task before anything is rendered or sent. Without either this is the module alone.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.text.converters import to_bytes
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import lookup_loader
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import LOOK_ARGS

MODULE = "vllm_ops.dflash.vllm_drift"
# This collection's roles, whose templates/ an item names with `role` (plugins/action/ -> the collection).
ROLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")


class _LookupVariables(dict):
    """The task's variables as the template lookup's `variables`, copied one level deep where it deep-copies them.

    The lookup deep-copies `variables` for each template only to add its own on top (template_path, ... and
    template_vars): a copy of the top level does that. The deep copies of every task variable made half of the
    three renders' CPU and a quarter of this task's on the controller, per host (bench/README.md). A template
    that changed a variable's value in place would now see that change in the next render; this collection's
    templates change only the dicts they make themselves (`{% set serve = {...} %}`).
    """

    def __deepcopy__(self, memo: Dict[int, Any]) -> Dict[str, Any]:
        return dict(self)


def sha256_text(text: str) -> str:
    """The sha256 the `hash('sha256')` filter gives a rendered template (its UTF-8 bytes)."""
    return hashlib.sha256(to_bytes(text, errors="surrogate_or_strict")).hexdigest()


class ActionModule(ActionBase):
    """Render and hash `templates` here, then run the vllm_drift module once with them as `files`."""

    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: Any = None) -> Dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp  # no temporary files: only the module runs on the host
        args = dict(self._task.args)
        checked = ArgumentSpecValidator(LOOK_ARGS).validate({name: args.pop(name, None) or [] for name in LOOK_ARGS})
        if checked.error_messages:
            raise AnsibleActionFail("; ".join(checked.error_messages))
        # The roles' own checks (names, env values, unit overrides), here rather than in a task per check and host.
        refused = [message.strip() for message in checked.validated_parameters["refusals"] if message.strip()]
        if refused:
            raise AnsibleActionFail(" ".join(refused))
        try:
            rendered = [self._expected(item, task_vars) for item in checked.validated_parameters["templates"]]
        except AnsibleError as exc:
            raise AnsibleActionFail(f"vllm_drift could not render the expected files: {exc}") from exc
        args["files"] = list(args.get("files") or []) + rendered
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        return result

    def _expected(self, item: Dict[str, Any], task_vars: Dict[str, Any]) -> Dict[str, Any]:
        """The module's `files` entry for one template: what the role's expected_files would send."""
        text = self.render(item, task_vars)
        expected: Dict[str, Any] = {"path": item["path"], "sha256": sha256_text(text)}
        expected.update({key: item[key] for key in ("mode", "owner", "group") if item[key] is not None})
        if item["input_record"] is not None:  # the role transforms this input on the host and records it
            expected["input_sha256"] = sha256_text(text + item["input_extra"])
            expected["input_record"] = item["input_record"]
        return expected

    def render(self, item: Dict[str, Any], task_vars: Dict[str, Any]) -> str:
        """`lookup('ansible.builtin.template', src, template_vars=vars)` as the role `role` runs it."""
        variables = _LookupVariables(task_vars)
        if item["role"]:
            role_path = os.path.join(ROLES_DIR, item["role"])
            if not os.path.isdir(os.path.join(role_path, "templates")):
                raise AnsibleActionFail(f"templates: {item['role']!r} is no role of {MODULE.rsplit('.', 1)[0]}")
            # The role's own directory first, as in its tasks (ansible_search_path: role, then the playbook's).
            search: List[str] = list(task_vars.get("ansible_search_path", []))
            variables["ansible_search_path"] = [role_path, *search]
        lookup = lookup_loader.get("ansible.builtin.template", loader=self._loader, templar=self._templar)
        return str(lookup.run([item["src"]], variables=variables, template_vars=item["vars"])[0])
