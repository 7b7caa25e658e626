"""Stand-in for ansible-test's pip bootstrap script (its download host is unreachable here).

Bootstraps pip with ensurepip, then installs what ansible-test asked for from the package index.
"""

import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap()
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
bundle = "/etc/ssl/certs/ca-certificates.crt"
if os.path.exists(bundle):
    args = ["--cert", bundle, *args]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
