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
      - Starts and stops the server in check mode too (it writes nothing), so that a client's check mode (a
        HEAD request of get_url) can tell whether its copy would change.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every O(state=started) starts another server, on another port and token.
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
  returned: success
  type: str
  sample: http://10.0.0.11:40123/q1w2e3r4t5y6u7i8o9p0aa/vllm-0.26.0-cp38-abi3-linux_x86_64.whl
port:
  description: The port the server listens on.
  returned: success
  type: int
pid:
  description: The server's process id, for O(state=stopped).
  returned: success
  type: int
token:
  description: The random path segment of RV(url), for O(state=stopped).
  returned: success
  type: str
stopped:
  description: Whether a running server was stopped (O(state=stopped)); V(false) when it had exited already.
  returned: success
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_serve import (
    WheelServeError,
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
        module.exit_json(changed=False, stopped=stop_server(params["pid"], params["token"]))
    try:
        server = start_server(params["path"], params["address"], params["timeout"])
    except WheelServeError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **server)


if __name__ == "__main__":
    main()
