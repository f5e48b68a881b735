"""Closing the host process to the processes it starts: on Linux, ``prctl(PR_SET_DUMPABLE, 0)``
(what ssh-agent does), through ``ctypes`` and the C library already loaded.

The host's environment may hold a provider key exported before it started, and its memory holds
every session's relay values and MCP headers. Its tool children (the model's shell) run as the
same user; a dumpable process of that user is open to them through ``/proc/<pid>/environ``,
``/proc/<pid>/mem`` and ``ptrace``. A process that is not dumpable is not: the kernel asks for
``CAP_SYS_PTRACE`` instead, and writes no core dump of it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Final

logger = logging.getLogger(__name__)

#: ``<linux/prctl.h>``.
_PR_SET_DUMPABLE: Final = 4


def harden_host_process() -> bool:
    """Make this process non-dumpable (Linux): from now on a process of the same user that
    lacks ``CAP_SYS_PTRACE`` (a tool child, anything the user runs) can neither read
    ``/proc/<pid>/environ`` or ``/proc/<pid>/mem`` nor attach with ``ptrace``, and no core
    dump is written. ``maple-acp serve`` calls it first thing; a library host calls it once,
    as early as it can (before it reads a secret is best). True when the flag is set; False
    on a system without it (macOS, Windows), or if the kernel refused (logged at WARNING).

    It is no sandbox: root and holders of ``CAP_SYS_PTRACE`` still read the process, a
    process that opened ``/proc/<pid>/mem`` or attached before the call keeps what it has, an
    ``exec`` or a change of user ids sets the flag again, and the host's command line, open
    files and sockets stay what they are (see docs/security.md)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError) as exc:
        logger.warning("could not make the host process non-dumpable: %s", exc)
        return False
    zero = ctypes.c_ulong(0)
    if prctl(ctypes.c_int(_PR_SET_DUMPABLE), zero, zero, zero, zero) != 0:
        errno = ctypes.get_errno()
        logger.warning(
            "could not make the host process non-dumpable: %s", os.strerror(errno) or errno
        )
        return False
    return True
