"""sd_notify in a few lines, so the trainer is a good `Type=notify` systemd citizen.

systemd passes an AF_UNIX datagram socket in $NOTIFY_SOCKET (a leading "@" means the Linux
abstract namespace). Without the variable every call is a no-op, so the same code runs under
systemd, in a terminal and in tests. Sending never raises: a vanished socket must not kill a
training run.
"""

import os
import socket


def notify(*fields: str) -> bool:
    """Send "KEY=value" fields (joined by newlines) to systemd. Returns True if a datagram went out."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall("\n".join(fields).encode())
        return True
    except OSError:
        return False


def status(text: str) -> bool:
    """A one-line STATUS= shown by `systemctl status` (e.g. "target 3/7 loaded")."""
    return notify("STATUS=" + text.replace("\n", " "))


def ready(text: str = "training") -> bool:
    return notify("READY=1", "STATUS=" + text)


def watchdog() -> bool:
    return notify("WATCHDOG=1")


def stopping() -> bool:
    return notify("STOPPING=1")
