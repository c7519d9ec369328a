"""Loopback ports for the harness's own servers, chosen below the kernel's ephemeral range.

A port found free by binding port 0 comes from the ephemeral range (32768-60999 on Linux), so in the
moment between releasing it and the server binding it again, any outgoing connection on the machine
may take it as its source port: the server then fails to bind, and a test fails by chance. Ports in
PORT_RANGE are never handed out as source ports, so a port found free there stays free for us.
"""

from __future__ import annotations

import itertools
import os
import socket

# Below the ephemeral range, and above every fixed port of hack/ (16443-29443).
PORT_RANGE = (30000, 32700)
_span = PORT_RANGE[1] - PORT_RANGE[0]
# Each process starts at its own offset, so that two harness processes rarely probe the same ports
# and a port one of them just released (TIME_WAIT) is not the next one tried.
_next = itertools.count(os.getpid() * 37 % _span)


def free_port() -> int:
    """A loopback port in PORT_RANGE that nothing listens on now."""
    for _ in range(_span):
        port = PORT_RANGE[0] + next(_next) % _span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {PORT_RANGE}")
