"""systemd's own vocabulary for how a service ended: its `Result=` values (systemd.exec(5),
"$SERVICE_RESULT") and its process exit codes (systemd.exec(5), "Process Exit Codes": the LSB
codes 0-7 and systemd's own EXIT_* codes 200-244, which mean the trainer never ran: systemd failed
a set-up step before exec). The journal spells them "Failed with result 'oom-kill'." and
"Main process exited, code=exited, status=217/USER"."""

from __future__ import annotations

import re

from .entry import Entry

SOURCE = "systemd.exec(5): Process Exit Codes, $SERVICE_RESULT (systemd 252)"

# systemd's EXIT_* codes: the set-up step that failed before the trainer's exec.
EXIT_STEPS = {200: "CHDIR", 201: "NICE", 202: "FDS", 203: "EXEC", 204: "MEMORY", 205: "LIMITS",
              206: "OOM_ADJUST", 207: "SIGNAL_MASK", 208: "STDIN", 209: "STDOUT", 210: "CHROOT",
              211: "IOPRIO", 212: "TIMERSLACK", 213: "SECUREBITS", 214: "SETSCHEDULER",
              215: "CPUAFFINITY", 216: "GROUP", 217: "USER", 218: "CAPABILITIES", 219: "CGROUP",
              220: "SETSID", 221: "CONFIRM", 222: "STDERR", 224: "PAM", 225: "NETWORK",
              226: "NAMESPACE", 227: "NO_NEW_PRIVILEGES", 228: "SECCOMP", 229: "SELINUX_CONTEXT",
              230: "PERSONALITY", 231: "APPARMOR_PROFILE", 232: "ADDRESS_FAMILIES",
              233: "RUNTIME_DIRECTORY", 235: "CHOWN", 236: "SMACK_PROCESS_LABEL", 237: "KEYRING",
              238: "STATE_DIRECTORY", 239: "CACHE_DIRECTORY", 240: "LOGS_DIRECTORY",
              241: "CONFIGURATION_DIRECTORY", 242: "NUMA_POLICY", 243: "CREDENTIALS", 244: "BPF"}
# Where a failed step points, when it points somewhere specific (default: the unit's settings).
EXIT_STEP_MEANINGS = {
    "EXEC": ("fix-venv", "ExecStart='s program (the venv's dflash-train) is missing or not executable: re-sync the "
             "venv (provision)"),
    "USER": ("fix-config", "the unit's User= does not exist on this host (provision creates the run user)"),
    "GROUP": ("fix-config", "the unit's Group= does not exist on this host"),
    "CHDIR": ("fix-config", "the unit's WorkingDirectory= is missing or not accessible to its user"),
    "NAMESPACE": ("fix-config", "systemd could not set up the unit's mount namespace (a path in ReadWritePaths=, "
                  "ReadOnlyPaths= or BindPaths= is missing, or the container forbids it)"),
    "STATE_DIRECTORY": ("fix-config", "the unit's StateDirectory= could not be created or chowned"),
    "MEMORY": ("fix-config", "systemd ran out of memory setting up the unit"),
}

RESULT_SAMPLE = "Failed with result '{}'."
# Result= values of a failed service: (verdict, action, meaning, the exit a death with it has).
RESULTS = {
    "exit-code": ("crash", "investigate", "the trainer exited with a non-zero status: its output says why",
                  ("exited", 1)),
    "signal": ("killed-by-signal", "rerun", "a signal ended the trainer (systemd's record names it)", ("killed", 15)),
    "core-dump": ("crash", "investigate", "the trainer dumped core (a crash signal): coredumpctl shows the stack",
                  ("dumped", 11)),
    "timeout": ("start-timeout", "raise-timeout", "a start or stop did not finish within its timeout "
                "(TimeoutStartSec=/TimeoutStopSec=)", ("killed", 15)),
    "watchdog": ("watchdog-hang", "rerun", "the trainer stopped sending WATCHDOG=1 within WatchdogSec=", ("killed", 6)),
    "oom-kill": ("cgroup-oom-kill", "fix-config", "the kernel's or systemd-oomd's OOM killer ended a process of the "
                 "unit", ("killed", 9)),
    "start-limit-hit": ("start-limit-hit", "reset-failed", "systemd refused a further start (StartLimitBurst= "
                        "within StartLimitIntervalSec=)", ("exited", 1)),
    "protocol": ("crash", "investigate", "the service broke its start protocol (a Type=notify unit that exited "
                 "before READY=1)", ("exited", 0)),
    "resources": ("exec-failed", "fix-config", "systemd could not set up the unit's resources (a fork, a cgroup, a "
                  "mount, a PID file): the trainer never ran", None),
    "exec-condition": ("exec-failed", "fix-config", "the unit's ExecCondition= failed: the trainer never ran", None),
    "skip-condition": ("exec-failed", "fix-config", "the unit's ExecCondition= told systemd to skip it: the trainer "
                       "never ran", None),
}


def _exit_entry(code: int, step: str) -> Entry:
    action, meaning = EXIT_STEP_MEANINGS.get(step, ("fix-config", f"systemd failed the unit's {step} set-up step "
                                                                  "(its journal line names what)"))
    return Entry("systemd-exit", f"EXIT_{step}", re.compile(rf"code=exited, status={code}/{step}\b"),
                 f"exit status {code}/{step}: the trainer never ran; {meaning}", "exec-failed", action, SOURCE,
                 f"Main process exited, code=exited, status={code}/{step}", where="systemd", number=code,
                 key=f"{code}/{step}")


def _result_entry(result: str) -> Entry:
    verdict, action, meaning, exit_ = RESULTS[result]
    return Entry("systemd-result", result, re.compile(re.escape(RESULT_SAMPLE.format(result))),
                 f"Result={result}: {meaning}", verdict, action, SOURCE, RESULT_SAMPLE.format(result),
                 where="systemd", extra={"exit": exit_})


# systemd's messages about a unit that name a cause of their own.
OOMD = Entry(
    "systemd-message", "systemd-oomd", re.compile(r"systemd-oomd killed (?:\d+|some) process\(es\) in this unit"),
    "systemd-oomd ended the unit on the memory pressure or swap use of its slice (ManagedOOMMemoryPressure=, "
    "ManagedOOMSwap=), not on a MemoryMax= limit", "cgroup-oom-kill", "fix-config", "systemd-oomd.service(8)",
    "systemd-oomd killed 7 process(es) in this unit.", where="systemd", extra={"exit": ("killed", 9)})

ENTRIES = (tuple(_exit_entry(code, step) for code, step in EXIT_STEPS.items())
           + tuple(_result_entry(r) for r in RESULTS) + (OOMD,))
