"""The Linux kernel's message families that explain (or locate) a training run's death, beyond the
OOM killer, NVRM/Xid and user-space crash lines that the kernel reader parses itself: machine
checks and memory poisoning (the CPU or RAM failed), the hung-task and lockup detectors (where a
process stuck), NFS servers that stopped answering, filesystem and block-device errors, PCIe AER,
and the kernel's own bugs. Sources: the kernel's documentation (admin-guide/ras.rst, the
lockup-watchdogs text, hung_task's sysctl, filesystems/ext4 and xfs, PCI/pcieaer-howto.rst) and the
printk formats of the code that prints them (mce, memory-failure.c, EDAC, hung_task.c, watchdog.c,
rcu, nfs, ext4/xfs, blk-core, aer).

`verdict` "crash" marks a family that locates a death without proving its cause (a hung task, a
lockup): the rules quote its line in the reason, and where the run hung (a watchdog kill, a start
that timed out) its `hang` action is the next step; the others are verdicts of their own."""

from __future__ import annotations

import re

from .entry import Entry

_HW = ("host-hardware-error", "drain-contact-support")
_STALL = ("crash", "investigate")
_FS = ("filesystem-error", "check-filesystem")


def _e(name, pattern, meaning, kind, source, sample, key="", hang=None):
    """hang: the action when the family's line explains a hung run (a watchdog kill, a start that timed
    out): a process stuck in the kernel cannot be killed, so the node must be rebooted."""
    verdict, action = kind
    return Entry("kernel", name, re.compile(pattern), meaning, verdict, action, source, sample, where="kernel",
                 key=key, extra={"hang": hang} if hang else {})


ENTRIES = (
    # the machine itself: CPU/RAM errors the hardware reported (uncorrected ones kill processes)
    # An MCE bank's status word has bit 61 (UC) set for an uncorrected error: the top hex digit is one
    # of 2 3 6 7 a b e f. Corrected errors (most "Machine check events logged") are not a death's cause.
    _e("mce-uncorrected", r"mce: \[Hardware Error\]: CPU \d+: Machine Check(?: Exception)?: \d+ Bank \d+: "
       r"[2367abef][0-9a-f]{15}\b|mce: \[Hardware Error\]: .*\bUncorrected\b|Kernel panic - not syncing: .*[Mm]achine check",
       "the CPU or memory reported an uncorrected machine check (a hardware error): drain the node and have the "
       "hardware checked (mcelog / rasdaemon, the vendor's diagnostics)", _HW,
       "admin-guide/ras.rst; arch/x86/kernel/cpu/mce (MCi_STATUS bit 61, UC)",
       "mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: be00000000800400", key="Hardware Error"),
    _e("memory-failure", r"Memory failure: 0x[0-9a-f]+: |MCE: Killing \S+:\d+ due to hardware memory corruption"
       r"|Uncorrected hardware memory error in user-access",
       "a page of RAM was poisoned by an uncorrected memory error and the processes using it were killed: drain the "
       "node, replace the DIMM", _HW, "mm/memory-failure.c",
       "Memory failure: 0x1a2b3c: recovery action for dirty LRU page: Recovered", key="Memory failure"),
    _e("edac-uncorrected", r"EDAC \S+: \d+ UE |EDAC .*Uncorrected|EDAC .*UE memory (?:read|write|scrub) error",
       "the memory controller reported an uncorrected error: drain the node, replace the DIMM named", _HW,
       "drivers/edac (EDAC_MC UE reports)", "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#1_DIMM#0",
       key="UE memory"),
    # where a process stuck (they locate a hang; the death's own rule names the verdict)
    _e("hung-task", r"INFO: task \S+:\d+ blocked for more than \d+ seconds",
       "the kernel's hung-task detector saw a process blocked in uninterruptible sleep (D state): usually I/O that "
       "never completed (a network filesystem, a failing disk, a GPU driver call)", _STALL, "kernel/hung_task.c",
       "INFO: task python:41231 blocked for more than 120 seconds.", key="blocked for more than", hang="reboot-node"),
    _e("soft-lockup", r"BUG: soft lockup - CPU#\d+ stuck for \d+s",
       "a CPU ran kernel code without yielding for seconds (soft lockup): a driver or kernel bug, or a host so "
       "overloaded that the run stalled", _STALL, "kernel/watchdog.c, admin-guide/lockup-watchdogs.rst",
       "watchdog: BUG: soft lockup - CPU#17 stuck for 23s! [python:41231]", key="soft lockup", hang="reboot-node"),
    _e("hard-lockup", r"Watchdog detected hard LOCKUP on cpu \d+",
       "a CPU stopped taking interrupts (hard lockup): a kernel or hardware fault", _STALL,
       "kernel/watchdog_perf.c, admin-guide/lockup-watchdogs.rst", "NMI watchdog: Watchdog detected hard LOCKUP on cpu 5",
       key="hard LOCKUP", hang="reboot-node"),
    _e("rcu-stall", r"rcu: INFO: rcu_\w+ (?:self-)?detected stalls? on CPUs?|rcu_\w+ kthread starved",
       "RCU grace periods stalled: a CPU stuck in the kernel (a driver bug or a hung device)", _STALL,
       "Documentation/RCU/stallwarn.rst", "rcu: INFO: rcu_sched self-detected stall on CPU", key="stall on CPU", hang="reboot-node"),
    _e("nfs-not-responding", r"nfs: server \S+ not responding",
       "the NFS server of a mounted path stopped answering: processes reading or writing it hang", _FS,
       "fs/nfs (nfs_timeout messages)", "nfs: server nfs1.example.com not responding, still trying",
       key="not responding", hang="check-filesystem"),
    # the kernel's own faults
    _e("kernel-bug", r"BUG: unable to handle (?:page fault|kernel NULL pointer dereference)|kernel BUG at |"
       r"Oops: \d{4}|general protection fault, .*: 0000 \[#\d+\]",
       "the kernel itself faulted (an Oops): a driver or kernel bug; the process in the Oops was killed and the "
       "node may be unstable: reboot it", _STALL, "the kernel's Oops report (oops-tracing.rst)",
       "BUG: unable to handle page fault for address: ffffb4a1c2d3e000", key="unable to handle"),
    _e("oom-no-killable", r"Out of memory and no killable processes|System is deadlocked on memory",
       "the host ran out of memory and the OOM killer found nothing it could kill: the kernel panicked",
       ("host-oom-kill", "fix-config"), "mm/oom_kill.c", "Out of memory and no killable processes...",
       key="no killable processes"),
    _e("kernel-panic", r"Kernel panic - not syncing",
       "the kernel panicked (the node went down with the run): the panic's reason follows the words",
       _STALL, "kernel/panic.c", "Kernel panic - not syncing: Fatal exception", key="Kernel panic"),
)
