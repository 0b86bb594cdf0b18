"""Whether a rank's process still runs, judged from /proc where that can be done: on the host
that wrote the record, from the same PID namespace. Elsewhere: unknown (None)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from rankscope.procfs import read_pidns_inode, read_start_ticks

# (host, pid, start ticks, pid namespace inode) -> running, gone, or None: cannot tell here
Alive = Callable[[str | None, int | None, int | None, int | None], "bool | None"]


def local_alive(
    host: str | None, pid: int | None, start_ticks: int | None, pidns: int | None
) -> bool | None:
    """True while it runs, False once gone (or its pid reused), None where unseen from here."""
    if host != socket.gethostname() or pid is None or start_ticks is None or pidns is None:
        return None
    if pidns != read_pidns_inode("self"):
        return None
    return read_start_ticks(pid) == start_ticks
