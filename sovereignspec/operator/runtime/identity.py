"""Who this operator process is, for kopf, without the password database.

kopf's default identity calls `getpass.getuser()`, which raises in an image whose UID has no passwd
entry (the chart runs as 65532): the Pod would crash-loop before deciding anything. The Pod's name
(the downward API's POD_NAME, or the hostname a Pod gets) identifies it well enough. Standard
library only, so that it can be tried under any UID.
"""

from __future__ import annotations

import os
import socket


def operator_identity() -> str:
    name = os.environ.get("POD_NAME") or socket.gethostname() or "sovereignspec"
    return f"sovereignspec@{name}/{os.getpid()}"
