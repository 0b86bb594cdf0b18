"""Which files of a directory changed since the last look: inotify where the kernel has it,
so an idle directory of any size costs nothing; else (or when inotify cannot tell) a full
pass, where the reader checks every file by stat."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import time
import weakref
from pathlib import Path

log = logging.getLogger("rankscope.daemon")

# A full pass this often even with inotify: retries unreadable files, and catches what a
# watch cannot see (a network filesystem's remote writers). About 1 s of CPU at 100,000
# files on the dev VM, so rare enough to keep an idle daemon under 1% of a core.
FULL_PASS_S = 300.0

# inotify(7)'s bits. Every event but a read is watched: the reader's own reads would wake it.
_IN_ALL_EVENTS = 0xFFF
_IN_READS = 0x1 | 0x10 | 0x20  # ACCESS, CLOSE_NOWRITE, OPEN
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
_WATCHED = (_IN_ALL_EVENTS & ~_IN_READS) | _IN_ONLYDIR
_LOST = _IN_Q_OVERFLOW | _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF  # rescan, re-watch
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.inotify_init1  # noqa: B018  (absent outside Linux)
    except (OSError, AttributeError):
        return None
    return libc


class DirWatch:
    """``changes()`` -> the names that changed since the last call, or None: look at every
    file (the first call, no inotify, a lost or overflowed watch, or FULL_PASS_S passed)."""

    def __init__(self, directory: Path, use_inotify: bool = True) -> None:
        self.directory = directory
        self._libc = _libc() if use_inotify else None
        self._fd = self._wd = -1
        self._full_pass_at = 0.0
        self._watch_error: int | None = None  # logged once, not each refresh
        if self._libc is not None:
            self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if self._fd < 0:
                log.warning(
                    "inotify unavailable (%s): every refresh checks each flight file by stat",
                    os.strerror(ctypes.get_errno()),
                )
                self._libc = None
            else:
                weakref.finalize(self, os.close, self._fd)

    @property
    def inotify(self) -> bool:
        return self._libc is not None

    def changes(self) -> set[str] | None:
        if self._libc is None:
            return None
        now = time.monotonic()
        names = self._drain() if self._wd >= 0 else None  # None: the watch was lost
        if self._wd < 0:  # what changed before the new watch is unknown
            self._watch()
        if names is None or now >= self._full_pass_at:
            self._full_pass_at = now + FULL_PASS_S
            return None
        return names

    def _watch(self) -> None:
        assert self._libc is not None
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(self.directory), _WATCHED)
        error = ctypes.get_errno() if wd < 0 else None
        if error not in (None, errno.ENOENT, errno.ENOTDIR, self._watch_error):
            log.warning(
                "cannot watch flight directory %s (%s): refreshes check each file by stat",
                self.directory,
                os.strerror(error or 0),
            )
        self._watch_error, self._wd = error, wd

    def _drain(self) -> set[str] | None:
        """The names in the queued events; None when the watch was lost or overflowed."""
        names: set[str] = set()
        lost = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size
                if size:
                    names.add(os.fsdecode(data[at : at + size].rstrip(b"\0")))
                at += size
                if mask & _LOST:
                    lost = True
        if lost:
            self._wd = -1  # the kernel dropped it or the directory moved: watch anew
            return None
        return names
