"""sd_notify in a few lines, so the trainer is a good `Type=notify` systemd citizen.

systemd passes an AF_UNIX datagram socket in $NOTIFY_SOCKET (a leading "@" means the Linux
abstract namespace). Without the variable every call is a no-op, so the same code runs under
systemd, in a terminal and in tests. Sending never raises: a vanished socket must not kill a
training run.

The trainer talks to one type, `Notifier` (status / ready / watchdog / stopping / extend_timeout). This base class
sends to systemd; `NullNotifier` sends nothing (drafter ranks other than a node's local rank 0);
topology.py's `QueueNotifier` forwards to the node's main process, which sends for its children.
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


class Notifier:
    """Where one process's service notifications go: here, straight to systemd."""

    def status(self, text: str) -> bool:
        """A one-line STATUS= shown by `systemctl status` (e.g. "target 3/7 loaded")."""
        return notify("STATUS=" + text.replace("\n", " "))

    def ready(self, text: str = "training") -> bool:
        return notify("READY=1", "STATUS=" + text)

    def watchdog(self) -> bool:
        return notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return notify("STOPPING=1")

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC: the start (or stop) may take `seconds` more from now; systemd
        fails it only once both this and the unit's own timeout have passed without a new one."""
        return notify(f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1e6))}")

    @staticmethod
    def null() -> "Notifier":
        return NullNotifier()


class NullNotifier(Notifier):
    """Says nothing: a process whose notifications another one sends."""

    def status(self, text: str) -> bool:
        return False

    def ready(self, text: str = "training") -> bool:
        return False

    def watchdog(self) -> bool:
        return False

    def stopping(self) -> bool:
        return False

    def extend_timeout(self, seconds: float) -> bool:
        return False
