"""Linux errno, the whole table as Python's `errno` module and `os.strerror` give it (from the C
library's <errno.h>, errno(3)), with what each means when a training run's file, network or process
call fails with it. Entries with no run-specific meaning still name the error and its text: the
verdict is a crash, the next step to read the call that failed.

How a log spells an errno: Python's `[Errno 28] No space left on device` (OSError and its
subclasses, named by `type(OSError(n, ...))`), the C name (`ENOSPC`), or the C library's message
alone (`strerror`, case-sensitive, as perror(3) and most native libraries print it)."""

from __future__ import annotations

import errno as _errno
import os
import re

from .entry import Entry

SOURCE = "Linux errno(3) / <errno.h>, as Python's errno module and os.strerror() give it"

# What an errno means for a run, where it means more than "the call failed": (verdict, action, meaning).
# A connection that failed: the line names the peer, which may be local (wandb's service process, a
# DataLoader worker's socket) as often as remote, so errno alone proves no network fault; the hub's,
# wandb's and the rendezvous's own words do (signatures.HINTS, read before the catalogues).
_CONNECTION = ("crash", "investigate", "a connection failed: look at the peer the line names (a local service "
               "that died, or a remote one the network cannot reach)")
MEANINGS = {
    "ENOSPC": ("disk-full", "free-disk", "the filesystem written to is full (or out of inodes)"),
    "EDQUOT": ("disk-full", "free-disk", "the user's or project's disk quota is exhausted, not the filesystem"),
    "EROFS": ("filesystem-error", "check-filesystem", "the filesystem is read-only (remounted after I/O errors, or "
              "read-only to the unit: ReadOnlyPaths=, ProtectSystem=)"),
    "EIO": ("filesystem-error", "check-filesystem", "the device or filesystem failed an I/O"),
    "EUCLEAN": ("filesystem-error", "check-filesystem", "the filesystem's structure is corrupt: it needs fsck"),
    "ESTALE": ("filesystem-error", "check-filesystem", "an NFS file handle went stale: the export was changed or the "
               "server restarted under the run"),
    "ENOLCK": ("filesystem-error", "check-filesystem", "no file lock could be taken (an NFS mount without lockd)"),
    "EBADMSG": ("filesystem-error", "check-filesystem", "corrupt data read from the filesystem"),
    "ENOMEM": ("crash", "fix-config", "host memory ran out for this allocation (mmap, fork, a pinned buffer): lower "
               "DataLoader workers, prefetch or batch; raise the unit's MemoryMax only where one is set"),
    "EMFILE": ("crash", "fix-config", "the process's open-file limit is reached (the unit's LimitNOFILE=)"),
    "ENFILE": ("crash", "fix-config", "the host's open-file table is full (fs.file-max)"),
    "EAGAIN": ("crash", "investigate", "a resource was temporarily unavailable (a thread or process limit when thread "
               "words are next to it; otherwise a non-blocking call)"),
    "EACCES": ("crash", "fix-config", "permission denied: the unit's user cannot read or write the path named "
               "(ownership, mode, the unit's User=, ReadOnlyPaths=)"),
    "EPERM": ("crash", "fix-config", "operation not permitted for the unit's user or its sandbox (capabilities, "
              "seccomp, NoNewPrivileges=)"),
    "ENOENT": ("crash", "investigate", "a path the run needs does not exist: a wrong path in the run's configuration, "
               "or a file that was never staged (the line names it)"),
    "ENOTDIR": ("crash", "fix-config", "a path the run uses as a directory is a file"),
    "EISDIR": ("crash", "fix-config", "a path the run uses as a file is a directory"),
    "EEXIST": ("crash", "fix-config", "a path the run creates already exists"),
    "ENAMETOOLONG": ("crash", "investigate", "a path or file name is longer than the filesystem allows (the program "
                     "built it)"),
    "EXDEV": ("crash", "fix-config", "a rename across filesystems: the temporary and final paths of a write must be "
              "on one filesystem"),
    "EFBIG": ("crash", "fix-config", "a file grew past the filesystem's or the unit's file size limit (LimitFSIZE=)"),
    "ETXTBSY": ("crash", "investigate", "an executable being written is running"),
    "EBUSY": ("crash", "investigate", "a device or resource is busy (another process holds it)"),
    "ENODEV": ("crash", "investigate", "no such device: a device node or driver the call needs is missing"),
    "ENXIO": ("crash", "investigate", "no such device or address: a device node exists without its device"),
    "ENOEXEC": ("crash", "fix-venv", "a binary of the wrong format (another architecture, or truncated)"),
    "EADDRINUSE": ("crash", "fix-config", "the port is taken (another run, a leftover process): give each run its own "
                   "master port, or stop the other process"),
    "EADDRNOTAVAIL": ("crash", "fix-config", "the address to bind is not this host's (a wrong MASTER_ADDR or bind "
                      "address)"),
    "ECONNREFUSED": _CONNECTION, "ECONNRESET": _CONNECTION, "ECONNABORTED": _CONNECTION, "ETIMEDOUT": _CONNECTION,
    "EHOSTUNREACH": _CONNECTION, "ENETUNREACH": _CONNECTION, "ENETDOWN": _CONNECTION, "EHOSTDOWN": _CONNECTION,
    "ENOTCONN": _CONNECTION, "ENETRESET": _CONNECTION, "EPIPE": ("crash", "investigate", "the reader of a pipe or socket "
                                                             "went away (the peer process or connection died first)"),
    "EINTR": ("crash", "investigate", "a call was interrupted by a signal"),
    "ECANCELED": ("crash", "investigate", "the operation was cancelled"),
}
_DEFAULT = ("crash", "investigate", "a system call failed")

_PATH = "/srv/runs/v2/checkpoints/step-300"


def _sample(num: int, name: str, text: str) -> str:
    # Python's own class for the errno (PermissionError, ConnectionRefusedError, plain OSError)
    cls = type(OSError(num, text)).__name__
    return f"{cls}: [Errno {num}] {text}: '{_PATH}'"


def _entry(num: int, name: str) -> Entry:
    text = os.strerror(num)
    verdict, action, meaning = MEANINGS.get(name, _DEFAULT)
    spellings = [rf"\[Errno {num}\]", rf"\b{name}\b"]
    if not text.startswith("Unknown error"):
        # the message alone, not a longer one it begins (EINTR's inside ERESTART's "... should be restarted")
        spellings.append(re.escape(text) + r"(?![ \t]+[a-z])")
    return Entry("errno", name, re.compile("|".join(spellings)), f"{name} ({text}): {meaning}", verdict, action,
                 SOURCE, _sample(num, name, text), number=num)


# One entry per number; where two names share one (EAGAIN/EWOULDBLOCK, EDEADLK/EDEADLOCK) the
# name errno.errorcode gives is the entry's.
ENTRIES = tuple(_entry(num, name) for num, name in sorted(_errno.errorcode.items()))
