#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_wheel_serve
short_description: Serve one wheel over HTTP from a host for a few minutes, for the other hosts to pull
description:
  - O(state=started) starts a small HTTP server in the background on the target, bound to O(address) on a port
    the kernel picks, that sends the file O(path) to a GET or HEAD of RV(url) (a path with a random token; any
    other path answers 404), and exits after O(timeout) seconds at the latest. The module returns at once.
  - O(state=stopped) stops the server that RV(pid) and RV(token) name; a server that is gone already (its
    O(timeout) passed) is no error.
  - The server checks nothing and the transfer is plain HTTP; the client checks the content, for example
    M(ansible.builtin.get_url) with O(ansible.builtin.get_url#module:checksum) set to the build's sha256.
    The deploy playbook distributes the fleet's wheel this way (C(dflash_wheel_distribution=peer)).
version_added: 0.2.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode no server starts and none is stopped. O(state=started) runs the checks a start does
        first (O(path) is a file, O(timeout), a bind of O(address) released at once) and returns what it would
        serve (RV(path), RV(size), RV(address), RV(timeout)) with C(changed=true) and no RV(url), RV(port),
        RV(pid) or RV(token); O(state=stopped) says in RV(stopped) whether it would stop a running server.
      - A play whose clients must reach the server in check mode too (a HEAD request of
        M(ansible.builtin.get_url)) sets the task keyword C(check_mode) to V(false) on the start and the stop
        task; the server writes nothing on this host.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every O(state=started) starts another server, on another port and token, and reports C(changed=true);
        O(state=stopped) reports C(changed=true) when it stopped a running server.
options:
  state:
    description: Whether to start a server or stop the one named by O(pid) and O(token).
    type: str
    choices: [started, stopped]
    default: started
  path:
    description: The file to serve (O(state=started)).
    type: path
  address:
    description:
      - The address to bind (O(state=started)); one of this host's that the clients reach, for example its
        C(ansible_host). V(0.0.0.0) binds every IPv4 address.
    type: str
  timeout:
    description: Seconds after which the server exits on its own, also when nobody stops it.
    type: float
    default: 900
  pid:
    description: RV(pid) of the server to stop (O(state=stopped)).
    type: int
  token:
    description: RV(token) of the server to stop (O(state=stopped)); a process without it is left alone.
    type: str
notes:
  - Runs on the target with its system Python and the standard library only.
seealso:
  - module: ansible.builtin.get_url
  - module: vllm_ops.dflash.vllm_build
"""

EXAMPLES = r"""
- name: Serve the built wheel from the build host
  vllm_ops.dflash.vllm_wheel_serve:
    path: "{{ build.wheel }}"
    address: "{{ ansible_host }}"
    timeout: 600
  register: wheel_server
  run_once: true
  delegate_to: "{{ build_host }}"

- name: Pull it on every host, checked against the build's sha256
  ansible.builtin.get_url:
    url: "{{ wheel_server.url }}"
    dest: /opt/vllm/wheels/fleet/
    checksum: "sha256:{{ build.wheel_sha256 }}"
    mode: "0644"

- name: Stop serving
  vllm_ops.dflash.vllm_wheel_serve:
    state: stopped
    pid: "{{ wheel_server.pid }}"
    token: "{{ wheel_server.token }}"
  run_once: true
  delegate_to: "{{ build_host }}"
"""

RETURN = r"""
url:
  description: Where the file is served (O(state=started)).
  returned: when a server started (not in check mode)
  type: str
  sample: http://10.0.0.11:40123/q1w2e3r4t5y6u7i8o9p0aa/vllm-0.26.0-cp38-abi3-linux_x86_64.whl
port:
  description: The port the server listens on.
  returned: when a server started (not in check mode)
  type: int
pid:
  description: The server's process id, for O(state=stopped).
  returned: when a server started (not in check mode)
  type: int
token:
  description: The random path segment of RV(url), for O(state=stopped).
  returned: when a server started (not in check mode)
  type: str
path:
  description: The file that would be served.
  returned: O(state=started) in check mode
  type: str
address:
  description: The address the server would bind (on a port the kernel picks).
  returned: O(state=started) in check mode
  type: str
size:
  description: The size of O(path) in bytes.
  returned: O(state=started) in check mode
  type: int
timeout:
  description: Seconds the server would live at most.
  returned: O(state=started) in check mode
  type: float
stopped:
  description:
    - Whether a running server was stopped (O(state=stopped)); V(false) when it had exited already.
    - In check mode, whether it would be stopped (the server named by O(pid) and O(token) still runs).
  returned: O(state=stopped)
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_serve import (
    WheelServeError,
    plan_server,
    server_running,
    start_server,
    stop_server,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            path=dict(type="path"),
            address=dict(type="str"),
            timeout=dict(type="float", default=900),
            pid=dict(type="int"),
            # Not a secret: a path segment of a URL that lives minutes, printed for the clients that pull it.
            token=dict(type="str", no_log=False),
        ),
        required_if=[("state", "started", ("path", "address")), ("state", "stopped", ("pid", "token"))],
        supports_check_mode=True,
    )
    params = module.params
    if params["state"] == "stopped":
        if module.check_mode:
            running = server_running(params["pid"], params["token"])
            module.exit_json(changed=running, stopped=running)
        stopped = stop_server(params["pid"], params["token"])
        module.exit_json(changed=stopped, stopped=stopped)
    try:
        if module.check_mode:
            plan = plan_server(params["path"], params["address"], params["timeout"])
            module.exit_json(
                changed=True,
                msg=f"check mode: would serve {plan['path']} ({plan['size']} bytes) on {plan['address']}, "
                f"on a port the kernel picks, for at most {plan['timeout']:g} s; nothing started",
                **plan,
            )
        server = start_server(params["path"], params["address"], params["timeout"])
    except WheelServeError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=True, **server)


if __name__ == "__main__":
    main()
