"""Linux signals, every one Python's `signal.Signals` knows (signal(7)), with what a run killed by
each means: who sends it, and whether systemd restarts the unit (systemd.service(5): SIGHUP,
SIGINT, SIGTERM and SIGPIPE are a clean exit to systemd, which Restart=on-failure does not restart).

The unit's record spells it `code=killed, status=7/BUS` (or `code=dumped` with a core) in
systemd's "Main process exited" line and ExecMainStatus=; the signals that only stop or are
ignored by default (SIGSTOP, SIGCHLD, ...) never end a process and are left out."""

from __future__ import annotations

import re
import signal as _signal

from .entry import Entry

SOURCE = "signal(7) (Linux), as Python's signal.Signals gives the numbers; systemd.service(5) for clean exits"

# Signals whose default action does not end the process (signal(7): Ign, Stop, Cont).
NEVER_KILL = {"SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGWINCH"}

_OUTSIDE = ("killed-by-signal", "rerun", "sent from outside the run (an operator, other automation, a stop that "
            "bypassed systemd): find who sent it")
# (verdict, action, meaning) of a death by each signal. A crash signal alone is a "crash": the
# native-crash verdict needs the native evidence (a kernel segfault line, an abort's message).
MEANINGS = {
    "SIGSEGV": ("crash", "investigate", "the process touched memory it does not own: a native library crashed "
                "(a core dump or the kernel's segfault line names it)"),
    "SIGABRT": ("crash", "investigate", "the process aborted itself (a C++ terminate, a glibc heap check, "
                "an assert, NCCL's watchdog tearing down)"),
    "SIGBUS": ("crash", "investigate", "a memory-mapped file shrank under the process (a truncated model or "
               "data file, re-staged while in use) or /dev/shm ran out"),
    "SIGILL": ("crash", "fix-venv", "an instruction this CPU lacks: a binary built for another CPU "
               "(AVX-512, a newer ARM) in the venv; install a build for this host"),
    "SIGFPE": ("crash", "investigate", "an arithmetic fault in native code (an integer division by zero)"),
    "SIGTRAP": ("crash", "investigate", "a trap or breakpoint instruction in native code (a compiler's "
                "unreachable, a debugger)"),
    "SIGSYS": ("crash", "fix-config", "a system call the unit's seccomp filter forbids "
               "(SystemCallFilter=): allow it for the run's unit"),
    "SIGXCPU": ("killed-by-signal", "fix-config", "the unit's CPU time limit was reached (LimitCPU=): raise it"),
    "SIGXFSZ": ("killed-by-signal", "fix-config", "the unit's file size limit was reached (LimitFSIZE=): raise it"),
    "SIGKILL": ("killed-by-signal", "rerun", "SIGKILL: the kernel's OOM killer, systemd's stop after its timeout, or "
                "someone outside the run; the kernel log tells which"),
    "SIGQUIT": ("killed-by-signal", "investigate", "SIGQUIT: sent from outside the run (it dumps core)"),
}


def _entry(sig: _signal.Signals) -> Entry:
    name, num = sig.name, int(sig)
    verdict, action, meaning = MEANINGS.get(name, _OUTSIDE)
    short = name.removeprefix("SIG")
    return Entry("signal", name, re.compile(rf"code=(?:killed|dumped), status={num}/{short}\b"),
                 f"{name} ({_signal.strsignal(sig)}): {meaning}", verdict, action, SOURCE,
                 f"Main process exited, code=killed, status={num}/{short}", where="systemd", number=num)


# A shell, or a launcher, reports its child's crash signal in strsignal(3)'s words: "Segmentation fault
# (core dumped)", or the words alone on their line ("Aborted" elsewhere is too common a word). That line
# is the native crash's own evidence.
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP", "SIGSYS")


def _shell_entry(sig: _signal.Signals) -> Entry:
    name, words = sig.name, _signal.strsignal(sig)
    _verdict, action, meaning = MEANINGS[name]
    return Entry("signal", f"{name} (child)", re.compile(rf"{re.escape(words)}\s*\(core dumped\)|^(?:.*\b\d+ +)?{re.escape(words)}\s*$"),
                 f"a child process crashed with {name} ({words}): {meaning}", "native-crash", action, SOURCE,
                 f"/opt/flashfleet/run.sh: line 12: 4242 {words} (core dumped) python -m flashfleet_trainer",
                 number=int(sig), key=words)


ENTRIES = (tuple(_entry(s) for s in sorted(_signal.Signals, key=int)
                 if s.name not in NEVER_KILL and not s.name.startswith("SIGRT") and int(s) < 32)
           + tuple(_shell_entry(_signal.Signals[name]) for name in CRASH_SIGNALS))
