"""The verdict on one death, as an ordered tuple of rules: each `rule(death) -> Finding | None`,
the first that returns a finding names the cause. RULES is docs/diagnosis.md's precedence list
("Verdicts and how they are decided"), in the same order and under the same names
(tests/unit/test_diagnosis_rules.py checks both, and each rule on recorded evidence).

A rule reads a Death: the facts of the invocation that ended and what the readers (journal.py,
kernel.py, output.py, gpu.py, disk.py) found in its window, each computed once when a rule first
asks for it."""

from __future__ import annotations

import re
from functools import cached_property

from ..contract import messages
from . import catalogues
from .disk import nearly_full, size
from .finding import Finding, dedupe
from .gpu import gpu_findings
from .journal import (
    Invocation,
    describe_exit,
    fmt_time,
    invocation_pids,
    is_manager_entry,
    jline,
    journal_is_complete,
    message,
    realtime,
    status_time,
)
from .kernel import host_memcg, kernel_reason, kline, memcg_in_host, memcg_names_other_unit
from .output import (
    app_signatures,
    exception_block,
    grep,
    hint_action,
    nccl_block,
    specific_lines,
    strip_prefix,
)
from .output import native_crash as find_native_crash
from .signatures import (
    ACTIONS,
    CLEAN_EXIT_SIGNALS,
    CRASH_SIGNALS,
    EXEC_STEP_ACTIONS,
    GPU_ACTION_ORDER,
    NEARLY_FULL_FRACTION,
    NEXT_OUTSIDE_CLEAN_EXIT,
    OOM_TIME_TIE_S,
    RE_CUDA_OOM,
    RE_DRIVER_LIB,
    RE_EXEC_STEP,
    RE_GPUISH,
    RE_NCCL_ERROR,
    RE_SHM_FULL,
    RE_SPECIFIC,
    RE_TORCH_SHORT_WRITE,
    RESTARTS_ON_CLEAN_EXIT,
    SIGNAL_NAMES,
    SYSTEMD_EXIT_STEPS,
    VERDICTS,
    XID_CATALOG,
    XID_HARDWARE,
)

# systemd's own lines that every failed end has: not what is specific about this one.
RE_ROUTINE_SYSTEMD = re.compile(r"Main process exited|Failed with result|Failed to start|Scheduled restart job"
                                r"|Consumed \S+ CPU time|Stopped |Start request repeated")

# The catalogues whose entries name a library's own failure: searched in the whole tail of the output,
# where the generic ones (an errno's message, an HTTP status) are read only in the lines that failed.
LIBRARY_LAYERS = {"nccl", "cuda", "cublas", "cudnn", "triton", "python"}


class Death:
    """One invocation's end and its evidence, as the rules read it."""

    def __init__(self, evidence: dict, unit: str, props: dict, status: dict, inv: Invocation, facts: dict,
                 scan: dict, app: list, base: list[str], current: bool):
        self.evidence, self.unit, self.props, self.status, self.inv = evidence, unit, props, status, inv
        self.facts, self.scan, self.app, self.base, self.current = facts, scan, app, base, current
        self.code, self.sig = facts["code"], facts["status"]
        self.killed = self.code in ("killed", "dumped")
        self.exit_desc = describe_exit(facts)
        self.unit_names = {unit, unit.replace("-", "\\x2d")}
        self.ooms, self.xids = scan["ooms"], scan["xids"]
        self.kernel_readable = (evidence.get("kernel") or {}).get("readable", True)

    @cached_property
    def no_stop_job(self) -> bool:
        """systemd's clean end of the invocation is in the journal (`Deactivated successfully.`) with
        no stop job before it: no one asked systemd to stop the unit. Only where the journal holds the
        invocation from its READY on (or whole), which is where a stop job would be."""
        journal = self.evidence.get("journal") or {}
        return (bool(self.inv.deactivated_line) and not self.inv.stopping and journal.get("readable", True)
                and (self.inv.started or journal_is_complete(self.evidence)))

    @cached_property
    def not_restarted(self) -> str:
        """What the unit's Restart= does with an end systemd counts as clean (Result=success)."""
        restart = self.props.get("Restart") or "on-failure"
        if restart in RESTARTS_ON_CLEAN_EXIT:
            return ""
        return f"Restart={restart} does not restart the unit: it stays down until started again"

    @cached_property
    def run_pids(self) -> set[str]:
        return invocation_pids(self.props if self.current else {}, self.status if self.current else {}, self.inv)

    # what the trainer's output holds
    @cached_property
    def exc(self) -> dict | None:
        return exception_block(self.app)

    @cached_property
    def config_hit(self):
        return grep(self.app, messages.CONFIG_ERROR_RE)

    @cached_property
    def is_config(self) -> bool:
        return bool(self.config_hit) or (self.code == "exited" and self.sig == messages.EX_CONFIG)

    @cached_property
    def nat(self) -> dict | None:
        return find_native_crash(self.app, self.scan["faults"], self.facts, self.run_pids)

    @cached_property
    def nccl(self) -> dict | None:
        return nccl_block(self.app)

    @cached_property
    def own(self) -> list[dict]:
        return app_signatures(self.app)

    # host, driver and toolchain findings: the kernel's, nvidia-smi's (now: only for the current death), the trainer's
    @cached_property
    def host(self) -> list[dict]:
        return self.scan["nvrm"] + (gpu_findings(self.evidence) if self.current else []) + self.own

    @cached_property
    def host_note(self) -> str:
        h = self.host
        return f"; also on this host: {h[0]['kind']} ({h[0]['source']}: {h[0]['text'][:160]})" if h else ""

    # the kernel catalogue's families in the window (catalogues/kernel.py)
    @cached_property
    def families(self) -> list[dict]:
        return self.scan.get("families") or []

    @cached_property
    def kernel_note(self) -> str:
        """The kernel's line that locates a death without proving its cause (a hung task, a lockup)."""
        stalls = [f for f in self.families if f["entry"].verdict == "crash"]
        return (f"; the kernel reported: {stalls[0]['text'][:200]} ({stalls[0]['entry'].meaning})" if stalls else "")

    @cached_property
    def catalogued(self) -> tuple | None:
        """(entry, line) of the layers' catalogues that the trainer's failure names: searched in the
        last exception's lines, else the trainer's own error line, else its most specific lines."""
        if self.exc:
            candidates = [self.exc["text"]]
        else:
            said = grep(self.app, messages.ERROR_RE)
            candidates = [said[1]] if said else [line for _, line in reversed(specific_lines(self.app))]
        for text in candidates:
            entry = catalogues.lookup(strip_prefix(text))
            if entry is not None:
                return entry, text
        if self.exc is None:  # a library's own line need not say "error" (NCCL's `Got completion ... status=12`)
            for _, text in reversed(self.app[-50:]):
                entry = catalogues.lookup(strip_prefix(text))
                if entry is not None and entry.layer in LIBRARY_LAYERS:
                    return entry, text
        return None

    @cached_property
    def signal_entry(self):
        """The signal catalogue's entry of the signal that ended the invocation, if one did."""
        if not (self.killed and self.sig is not None):
            return None
        return next((e for e in catalogues.CATALOGUES["signals"] if e.number == self.sig), None)

    @cached_property
    def systemd_said(self) -> list[tuple[float | None, str]]:
        """systemd's own lines about the invocation that say something specific (not the routine
        exit lines every failed end has)."""
        return [(realtime(e), message(e)) for e in self.inv.entries if is_manager_entry(e)
                and RE_SPECIFIC.search(message(e)) and not RE_ROUTINE_SYSTEMD.search(message(e))]

    @cached_property
    def memory_max(self) -> str | None:
        """The unit's MemoryMax= when it sets one (systemd shows `infinity` when it does not)."""
        limit = str(self.props.get("MemoryMax") or "").strip()
        return limit if limit and limit != "infinity" else None

    # the disk the run writes to
    @cached_property
    def disk(self) -> dict:
        disks = self.evidence.get("disk") or {}
        return disks.get("checkpoints") or disks.get("output_dir") or {}

    @cached_property
    def free(self) -> str:
        disk = self.disk
        if disk.get("free_bytes") is None:
            return ""
        where = disk.get("path") + (f" -> {disk['realpath']}" if disk.get("realpath") else "")
        return f"; {size(disk['free_bytes'])} free now on {where}"

    @cached_property
    def saving(self) -> str:
        return " during a checkpoint save" if grep(self.app, r"checkpoint|\.tmp-step-|torch[\\/]serialization\.py") else ""


# ---------------------------------------------------------------------------------------------
# the rules, in order (RULES at the end)


def clean_exit(d: Death) -> Finding | None:
    """An end systemd counts as clean (Result=success, exit 0): a stop through systemd or from outside
    it, a finished run; or, its exit record gone, a signal systemd counts as clean sent from outside
    while the run was still going. Restart=on-failure restarts none of them."""
    inv, facts, status, base = d.inv, d.facts, d.status, d.base
    phase = status.get("phase")
    if facts["result"] == "success" or (facts["code"] == "exited" and facts["status"] == 0):
        ended = [jline(inv.deactivated_ts, inv.deactivated_line)] if inv.deactivated_line else []
        at = f"status.json: phase={phase} step={status.get('step')}"
        if inv.stopping or (phase == "stopped" and not d.no_stop_job):
            proof = base + ([jline(None, inv.stopping_line)] if inv.stopping_line else []) + (
                [f"status.json: phase={phase}"] if phase else [])
            return Finding("stopped", "stopped through systemd (clean exit)", proof)
        if phase == "stopped":
            return Finding("stopped", "stopped from outside systemd: the trainer saved and exited 0 on a signal no "
                           "stop job sent (the journal has systemd's clean end and no `Stopping`: nobody asked "
                           "through systemctl)" + (f"; {d.not_restarted}" if d.not_restarted else ""),
                           base + ended + [at],
                           NEXT_OUTSIDE_CLEAN_EXIT)
        if phase == "completed":
            return Finding("completed", f"finished: exit 0, status.json phase=completed at step {status.get('step')}",
                           base + [at])
        if facts["result"] == "protocol":  # Type=notify: exit 0 without READY=1 fails since systemd 233
            return Finding("crash", "the trainer exited 0 without sending READY=1 (Result=protocol)", base,
                           action="investigate")
        if facts["code"] == "exited" and facts["status"] == 0:
            return Finding("unknown", "exit 0 but status.json says neither completed nor stopped",
                           base + [f"status.json: phase={phase}"])
        if facts["code"] is None and phase and d.no_stop_job:
            # the trainer's own clean ends say completed or stopped: this one was a signal that ends it at once
            names = "/".join(f"SIG{SIGNAL_NAMES[s]}" for s in sorted(CLEAN_EXIT_SIGNALS))
            return Finding("killed-by-signal",
                           f"killed from outside the run by a signal systemd counts as a clean exit ({names}): "
                           f"systemd ended the unit with Result=success and no stop job while status.json still "
                           f"said phase={phase} step={status.get('step')}; which signal is not known (systemd's "
                           "exit record is gone: the unit was unloaded or reset)"
                           + (f"; {d.not_restarted}" if d.not_restarted else "") + d.host_note,
                           base + ended + [at],
                           NEXT_OUTSIDE_CLEAN_EXIT)
    return None


def _xids_root(xids: list[dict], exit_desc: str, base: list[str]) -> Finding | None:
    """The first hardware Xid of the window is the root; later ones are listed. A follow-on Xid
    that names its cause (`45, ... caused by previous Xid 149`) points at the root too. The action
    is the strongest any of them needs (a Xid 154 states the driver's own recovery action)."""
    hw = [x for x in xids if x["kind"] == "hardware"]
    refs = [x for x in xids if x.get("caused_by") in XID_HARDWARE and XID_CATALOG[x["caused_by"]][0] == "hardware"]
    recovery = [x for x in xids if x["kind"] == "recovery"]
    if hw:
        root = hw[0]
        code, pci, mnemonic = root["code"], root["pci"], root["mnemonic"]
        how = f"NVIDIA Xid {code} ({mnemonic}, hardware/driver) on GPU {pci}"
    elif refs:
        ref = refs[0]
        code, pci = ref["caused_by"], ref["pci"]
        mnemonic = XID_CATALOG[code][3]
        root = {"code": code, "pci": pci, "action": XID_CATALOG[code][2], "line": ref["line"]}
        how = f"NVIDIA Xid {ref['code']} on GPU {pci} names Xid {code} ({mnemonic}, hardware/driver) as its cause"
    elif recovery:
        root = recovery[0]
        code, pci = root["code"], root["pci"]
        how = f"NVIDIA Xid 154 on GPU {pci}: the driver's GPU recovery action is {root.get('recovery') or '?'}"
    else:
        return None
    actions = [root["action"]] + [x["action"] for x in hw + recovery]
    action = max((a for a in actions if a in GPU_ACTION_ORDER), key=GPU_ACTION_ORDER.index, default=root["action"])
    seen, listed = set(), []
    for x in xids:
        key = (x["code"], x["pci"])
        if key in seen:
            continue
        seen.add(key)
        listed.append({"code": x["code"], "pci": x["pci"], "kind": x["kind"], "action": x["action"],
                       "count": sum(1 for y in xids if (y["code"], y["pci"]) == key),
                       **({"recovery": x["recovery"]} if x.get("recovery") else {}),
                       **({"caused_by": x["caused_by"]} if x.get("caused_by") else {})})
    others: dict[int, dict] = {}
    for x in listed:
        if x["code"] == code and x["pci"] == pci:
            continue
        o = others.setdefault(x["code"], {"count": 0, "gpus": set(), "kind": x["kind"], "recovery": x.get("recovery")})
        o["count"] += x["count"]
        o["gpus"].add(x["pci"])
    reason = how
    if others:
        reason += "; also in the window: " + ", ".join(
            f"Xid {c}" + (f" x{o['count']}" if o["count"] > 1 else "")
            + (f" on {len(o['gpus'])} GPUs" if len(o["gpus"]) > 1 else "") + f" ({o['kind']}"
            + (f", {o['recovery']}" if o.get("recovery") else "") + ")" for c, o in list(others.items())[:8])
    if action != root["action"]:
        reason += f"; the action follows the strongest of them ({action})"
    reason += f"; the run then ended with {exit_desc}"
    lines = base + dedupe([root["line"]] + [x["line"] for x in xids], 10)
    return Finding(f"gpu-xid-{code}", reason, lines, ACTIONS[action], action=action,
                   xid=code, pci=pci, xids=listed)



def hardware_xid(d: Death) -> Finding | None:
    """A hardware Xid in the window outranks the crash it caused: the first one is the root."""
    return _xids_root(d.xids, d.exit_desc, d.base)


def kernel_family(d: Death) -> Finding | None:
    """The machine itself failed in the window (catalogues/kernel.py): an uncorrected machine check,
    poisoned memory, an out-of-memory panic with nothing left to kill. Like a hardware Xid, it
    outranks what it caused."""
    hits = [f for f in d.families if f["entry"].verdict in ("host-hardware-error", "host-oom-kill")]
    if not hits:
        return None
    first = hits[0]
    return Finding(first["entry"].verdict, f"{first['entry'].meaning}: {first['text'][:240]} (the run then ended "
                   f"with {d.exit_desc})", d.base + dedupe([f["line"] for f in hits], 6), action=first["entry"].action,
                   kernel_family=first["entry"].name)


def kernel_oom_kill(d: Death) -> Finding | None:
    """A kernel OOM kill tied to the run: by its cgroup, its pid, or (containers) by time."""
    facts, sig = d.facts, d.sig
    host_cg = host_memcg(d.evidence)
    tied = []
    for oom in d.ooms:
        memcg = (oom.get("task_memcg") or "") + " " + (oom.get("oom_memcg") or "")
        if any(u in memcg for u in d.unit_names):
            tied.append((oom, f"its cgroup names {d.unit}"))
        elif oom["pid"] in d.run_pids:
            tied.append((oom, f"pid {oom['pid']} was the run's"))
        elif (sig == 9 and d.killed and not memcg_names_other_unit(oom.get("task_memcg"), d.unit_names)
              and memcg_in_host(oom.get("task_memcg"), host_cg)
              and oom.get("ts") is not None and facts["ts"] is not None
              and -OOM_TIME_TIE_S <= oom["ts"] - facts["ts"] <= 2.0):
            tied.append((oom, f"killed {facts['ts'] - oom['ts']:.1f} s before the unit's SIGKILL, in this host's "
                              f"cgroup {oom.get('task_memcg') or '?'} (tied by time: pid namespaces differ)"))
    if not tied:
        return None
    oom, why = tied[-1]
    host_wide = oom.get("constraint") == "CONSTRAINT_NONE" or (
        oom.get("constraint") is None and oom.get("memcg_kill") is False)
    verdict = "host-oom-kill" if host_wide else "cgroup-oom-kill"
    what = "the whole host ran out of memory" if host_wide else f"memory cgroup limit ({oom.get('oom_memcg') or oom.get('task_memcg') or 'cgroup'})"
    return Finding(verdict, f"kernel OOM killer killed {oom.get('comm')} pid {oom['pid']}: {what}; {why}",
                   d.base + oom["lines"], oom_pid=oom["pid"], constraint=oom.get("constraint"))


def systemd_oom_kill(d: Death) -> Finding | None:
    """systemd reports an OOM kill (Result=oom-kill) without a kernel line tied to the run."""
    oomd = next(((realtime(e), message(e)) for e in d.inv.entries
                 if catalogues.systemd.OOMD.pattern.search(message(e))), None)
    if not (d.facts["result"] == "oom-kill" or d.inv.oom_line or oomd):
        return None
    proof = d.base + ([jline(None, d.inv.oom_line)] if d.inv.oom_line else [])
    unknown = "" if d.kernel_readable else "; kernel log unreadable, whether the host or a limit ran out is not known"
    if oomd:  # systemd-oomd acts on pressure and swap, not on a MemoryMax= limit
        return Finding("cgroup-oom-kill", f"{catalogues.systemd.OOMD.meaning} ({strip_prefix(oomd[1]).strip()})",
                       proof + [jline(*oomd)], "lower the run's memory use (DataLoader workers, prefetch, batch), or "
                       "raise the slice's ManagedOOMMemoryPressureLimit= / give the host more memory; then train.yml")
    if d.memory_max is None:  # no limit on the unit: a limit above it (a container's, a slice's) or the host
        return Finding("cgroup-oom-kill", f"systemd reports an OOM kill in the unit's cgroup (Result=oom-kill) and the "
                       f"unit sets no MemoryMax= ({d.props.get('MemoryMax') or 'not recorded'}): the limit that ran out "
                       f"is above the unit (its slice's, the container's) or the host's memory{unknown}", proof,
                       "lower the run's memory use (DataLoader workers, prefetch, batch), or raise the limit of the "
                       "slice or container the unit runs in; then train.yml")
    return Finding("cgroup-oom-kill",
                   f"systemd reports an OOM kill in the unit's cgroup (Result=oom-kill, MemoryMax={d.memory_max}){unknown}",
                   proof)


def exec_failed(d: Death) -> Finding | None:
    """systemd could not start the trainer at all (exit 200-243, "Failed at step X spawning ...")."""
    step_hit = None
    for ts, line in d.app + [(realtime(e), message(e)) for e in d.inv.entries if is_manager_entry(e)]:
        m = RE_EXEC_STEP.search(line)
        if m:
            step_hit = (ts, line, m)
    if not (step_hit or (d.code == "exited" and d.sig in SYSTEMD_EXIT_STEPS)):
        never_ran = catalogues.lookup(f"Failed with result '{d.facts['result']}'.", "systemd", {"exec-failed"})
        if never_ran is None:
            return None
        said = d.systemd_said
        return Finding("exec-failed", f"{never_ran.meaning}" + (f": {said[-1][1].strip()[:240]}" if said else "")
                       + f" ({d.exit_desc})", d.base + [jline(*x) for x in said[-2:]], action=never_ran.action)
    step = step_hit[2].group("step") if step_hit else (d.facts.get("name") or SYSTEMD_EXIT_STEPS.get(d.sig))
    detail = (f" spawning {step_hit[2].group('path')}: {step_hit[2].group('error').strip()}" if step_hit else "")
    return Finding("exec-failed", f"systemd could not start the trainer: step {step} failed{detail} ({d.exit_desc})",
                   d.base + ([jline(step_hit[0], step_hit[1])] if step_hit else []),
                   action=EXEC_STEP_ACTIONS.get(step, "fix-config"), exec_step=step)


def start_timeout(d: Death) -> Finding | None:
    """READY=1 did not come within TimeoutStartSec."""
    inv, facts, app = d.inv, d.facts, d.app
    if not ((inv.start_timeout_line or (facts["result"] == "timeout" and not inv.started and not inv.stopping))
            and not inv.stopping):
        return None
    limit = d.props.get("TimeoutStartUSec")
    ended = facts["ts"] or inv.last_ts
    took = f" after {ended - inv.first_ts:.0f} s" if (inv.first_ts and ended and ended >= inv.first_ts) else ""
    last = next((line.strip() for _, line in reversed(app) if line.strip()), None)
    return Finding("start-timeout",
                   f"READY=1 did not come within TimeoutStartSec{f' ({limit})' if limit else ''}: systemd stopped the "
                   f"start{took} ({d.exit_desc})" + (f"; last output: {last[:160]}" if last else "; no output from the trainer")
                   + d.kernel_note,
                   d.base + ([jline(None, inv.start_timeout_line)] if inv.start_timeout_line else [])
                   + [f["line"] for f in d.families if f["entry"].verdict == "crash"][:2]
                   + [jline(ts, line) for ts, line in app[-2:] if line.strip()])


def cuda_oom(d: Death) -> Finding | None:
    """The trainer's output says the GPU ran out of memory (torch's, cuBLAS's, cuDNN's, NCCL's words)."""
    hit = grep(d.app, RE_CUDA_OOM)
    if not hit:
        return None
    return Finding("cuda-oom", f"GPU memory exhausted: {strip_prefix(hit[1]).strip()[:200]}", d.base + [jline(*hit)])


def shm_full(d: Death) -> Finding | None:
    """/dev/shm ran out (a DataLoader worker's shared memory, NCCL's shared-memory transport)."""
    shm_hit = grep(d.app, RE_SHM_FULL)
    if not shm_hit:
        return None
    shm = (d.evidence.get("disk") or {}).get("shm") or {}
    free = f"; {size(shm['free_bytes'])} free now on {shm.get('path', '/dev/shm')}" if shm.get("free_bytes") is not None else ""
    return Finding("disk-full", f"shared memory (/dev/shm) ran out: {strip_prefix(shm_hit[1]).strip()[:200]}{free}",
                   d.base + [jline(*shm_hit)], where="/dev/shm")


def disk_quota(d: Death) -> Finding | None:
    """EDQUOT: the quota of the user or project ran out, not the filesystem."""
    hit = grep(d.app, r"Disk quota exceeded|\[Errno 122\]")
    if not hit:
        return None
    return Finding("disk-full", f"disk quota exceeded (EDQUOT){d.saving}: the quota of the run's user or project "
                   f"is used up, not necessarily the filesystem (`quota -s`, `lfs quota`){d.free}; free space under "
                   f"the quota or raise it: {strip_prefix(hit[1]).strip()[:200]}", d.base + [jline(*hit)])


def disk_full(d: Death) -> Finding | None:
    """ENOSPC in the trainer's output."""
    hit = grep(d.app, r"No space left on device|\[Errno 28\]")
    if not hit:
        return None
    disk = d.disk
    if disk.get("free_bytes") is not None and not nearly_full(disk):
        inodes, total = disk.get("free_inodes"), disk.get("total_inodes")
        if total and inodes is not None and inodes < NEARLY_FULL_FRACTION * total:
            return Finding("disk-full", f"No space left on device (ENOSPC){d.saving}: out of inodes ({inodes} of {total} "
                           f"free), not of space{d.free}", d.base + [jline(*hit)],
                           "the filesystem has space but no free inodes: remove many small files (old caches, "
                           "extracted shards) or move the run to a filesystem with more inodes; then restart")
        return Finding("disk-full", f"No space left on device (ENOSPC){d.saving}, yet the run's filesystem is not full now"
                       f"{d.free}: the write that failed was on another filesystem (the path in the line: a "
                       f"temporary or cache directory, /dev/shm) or space was freed since",
                       d.base + [jline(*hit)], "find the filesystem of the path the error names (df -h PATH, "
                       "df -i PATH) and free it; then restart")
    return Finding("disk-full", f"No space left on device (ENOSPC){d.saving}{d.free}", d.base + [jline(*hit)])


def short_write(d: Death) -> Finding | None:
    """torch.save's zip writer does not say ENOSPC: a short write surfaces as "unexpected pos" or
    "PytorchStreamWriter failed writing file". Disk-full only when the filesystem is full now."""
    hit = grep(d.app, RE_TORCH_SHORT_WRITE)
    if not (hit and d.saving and nearly_full(d.disk)):
        return None
    return Finding("disk-full", f"the checkpoint save failed: a write came up short (torch: {hit[1].strip()[:120]}) "
                   f"on a full filesystem{d.free}", d.base + [jline(*hit)])


def peer_failure(d: Death) -> Finding | None:
    """A multi-node run's trainer says when another node went first (docs/trainer.md): this host's
    ranks failed because that one did, whatever exception their collectives raised."""
    hit = grep(d.app, messages.PEER_FAILURE_RE)
    if not hit:
        return None
    line = hit[1].strip()
    account = line[line.index(messages.ERROR_PREFIX) + len(messages.ERROR_PREFIX):].strip()
    return Finding("peer-failure", account[:300], d.base + [jline(*hit)])


def nccl_timeout(d: Death) -> Finding | None:
    """NCCL's watchdog: a collective timed out."""
    hit = grep(d.app, r"Watchdog caught collective operation timeout")
    if not hit:
        return None
    line = strip_prefix(hit[1]).strip()
    line = line[line.index("Watchdog caught"):] if "Watchdog caught" in line else line
    return Finding("nccl-timeout", f"NCCL collective timed out: {line[:240]}", d.base + [jline(*hit)])


def watchdog_hang(d: Death) -> Finding | None:
    """systemd's watchdog killed a trainer that stopped sending WATCHDOG=1."""
    inv, app = d.inv, d.app
    if not (d.facts["result"] == "watchdog" or inv.watchdog_line):
        return None
    proof = d.base + ([jline(None, inv.watchdog_line)] if inv.watchdog_line else [])
    tail = [jline(ts, line) for ts, line in app[-3:]]
    stalls = [f for f in d.families if f["entry"].extra.get("hang")]
    return Finding("watchdog-hang", "no WATCHDOG=1 within WatchdogSec: systemd killed the hung trainer"
                   + (f" (last output: {app[-1][1].strip()[:120]})" if app else "") + d.kernel_note,
                   proof + [f["line"] for f in stalls[:2]] + tail,
                   action=stalls[0]["entry"].extra["hang"] if stalls else None)


def host_finding(d: Death) -> Finding | None:
    """Host, driver, toolchain and filesystem findings, before blaming the configuration or a crash
    that is only their symptom: the kernel's NVRM and other lines, nvidia-smi's errors, the trainer's
    signatures. They lose only to an unrelated exception (which then names them: host_note)."""
    exc, host = d.exc, d.host
    if not host:
        return None
    explains = (exc is None or d.is_config or d.nat is not None or bool(d.own)
                or bool(RE_GPUISH.search(exc["text"])))
    if not explains:
        return None
    config_hit, nat = d.config_hit, d.nat
    h = host[0]
    then = (f"; the trainer then: {strip_prefix(config_hit[1]).strip()[:200]}" if config_hit else
            f"; the trainer then: {exc['text'][:240]}" if exc and h["text"] not in exc["text"] else
            f"; {nat['message'][:200]}" if nat else "")
    lines = d.base + dedupe([x["line"] for x in host], 6) + (exc["lines"][:3] if exc else []) + (
        [jline(*config_hit)] if config_hit else [])
    others = sorted({x["kind"] for x in host[1:]} - {h["kind"]})
    return Finding(h["kind"], f"{h['what']} ({h['source']}: {h['text'][:240]}){then} ({d.exit_desc})"
                   + (f"; also: {', '.join(others)}" if others else ""), dedupe(lines, 16), action=h["action"])


def nccl_error(d: Death) -> Finding | None:
    """NCCL's own error, with the cause its `Last error:` names."""
    nccl, exc = d.nccl, d.exc
    if not (nccl and (exc is None or exc["index"] >= nccl["index"] - 3 or RE_NCCL_ERROR.search(exc["text"]))):
        return None
    last = f"; Last error: {nccl['last_error']}" if nccl["last_error"] else "; NCCL gave no Last error"
    # the code's own entry (catalogues/nccl.py) says what it is where the Last error said nothing
    wanted = {"nccl-error", "nccl-timeout"}
    entry = (nccl["last_error"] and catalogues.lookup(nccl["last_error"], verdicts=wanted)
             or catalogues.lookup(nccl["text"], verdicts=wanted))
    if entry is not None and nccl["action"] == "investigate":
        return Finding(entry.verdict, f"{nccl['text'][:500]}{'' if nccl['last_error'] else last}; {entry.said} "
                       f"({d.exit_desc}){d.host_note}", d.base + nccl["lines"], action=entry.action,
                       nccl_code=nccl["code"], last_error=nccl["last_error"])
    return Finding("nccl-error", f"{nccl['text'][:500]}{'' if nccl['last_error'] else last} ({d.exit_desc}){d.host_note}",
                   d.base + nccl["lines"], action=nccl["action"], nccl_code=nccl["code"], last_error=nccl["last_error"])


def native_crash(d: Death) -> Finding | None:
    """A native crash, unless a Python exception came first and the abort is only its teardown."""
    nat, exc, app = d.nat, d.exc, d.app
    if nat is None:
        return None
    first = exc is None or nat["index"] < exc["index"] or (
        nat["index"] >= len(app) and nat.get("ts") is not None and exc.get("ts") is not None and nat["ts"] < exc["ts"])
    if not first:
        return None
    lib = nat.get("lib")
    hint, hint_act = hint_action(nat.get("what") or "")
    if lib and RE_DRIVER_LIB.search(lib):
        action = "fix-driver"
    elif nat.get("trap") and lib:
        action = "fix-venv"  # an instruction this CPU lacks: a binary built for another CPU
    else:
        action = hint_act or "investigate"
    reason = f"native crash: {nat['message'][:400]}" + (f" (in {lib})" if lib and lib not in nat["message"] else "")
    return Finding("native-crash", f"{reason} ({d.exit_desc}){d.host_note}", d.base + dedupe(nat["lines"], 8),
                   hint, action=action, library=lib)


def config_error(d: Death) -> Finding | None:
    """The trainer's deterministic config error (exit EX_CONFIG, one stderr line)."""
    if not d.is_config:
        return None
    config_hit = d.config_hit
    text = config_hit[1].strip() if config_hit else f"exit status {messages.EX_CONFIG} (config error)"
    return Finding("crash", text, d.base + ([jline(*config_hit)] if config_hit else []),
                   "fix the run configuration as the message says, then train.yml", action="fix-config",
                   kind="config-error")


def nonfinite_loss(d: Death) -> Finding | None:
    """The trainer stopped itself on a NaN/infinite loss (exit EX_NONFINITE, one stderr line):
    deterministic, so the unit does not restart it; the newest checkpoint is the last good one."""
    nonfinite_hit = grep(d.app, messages.NONFINITE_RE)
    if not (nonfinite_hit or (d.code == "exited" and d.sig == messages.EX_NONFINITE)):
        return None
    text = (nonfinite_hit[1].strip().removeprefix(messages.ERROR_PREFIX) if nonfinite_hit
            else f"exit status {messages.EX_NONFINITE} (non-finite loss)")
    return Finding("nonfinite-loss", text, d.base + ([jline(*nonfinite_hit)] if nonfinite_hit else []),
                   "lower --lr (or check the data), then train.yml: it resumes from the newest checkpoint, "
                   "the last good one", action="fix-config")


def layer_catalogue(d: Death) -> Finding | None:
    """The trainer's failure names an entry of a layer's own catalogue (errno, CUDA, NCCL, HTTP, ...)
    that proves a verdict of its own; entries that only explain a crash are the crash rule's."""
    if d.catalogued is None:
        return None
    entry, text = d.catalogued
    if entry.verdict == "crash" or entry.verdict not in VERDICTS:
        return None
    at = next((i for i in range(len(d.app) - 1, -1, -1) if d.app[i][1] == text), None)
    lines = d.exc["lines"] if d.exc else [jline(*x) for x in d.app[at:at + 3]] if at is not None else []
    return Finding(entry.verdict, f"{entry.said} (the output: {strip_prefix(text).strip()[:400]}; "
                   f"{d.exit_desc}){d.host_note}", d.base + lines, action=entry.action, catalogue=entry.layer)


def outside_signal(d: Death) -> Finding | None:
    """A signal that is not a crash, without a traceback: a stop through systemd, or someone outside
    the run (and what systemd's Restart= then does)."""
    sig, base = d.sig, d.base
    # Python's KeyboardInterrupt traceback is SIGINT's own doing, not a crash that preceded it
    interrupted = d.exc is not None and d.exc["name"].endswith("KeyboardInterrupt")
    if not (d.killed and sig is not None and sig not in CRASH_SIGNALS and (not d.exc or interrupted)):
        return None
    if d.inv.stopping:
        return Finding("stopped", f"stopped through systemd, ended by {d.exit_desc}",
                       base + [jline(None, d.inv.stopping_line)])
    entry = d.signal_entry
    reason = f"killed by {d.exit_desc} from outside the run" + (f" ({entry.name})" if entry else "")
    if entry is not None and entry.action == "fix-config":  # a limit of the unit's own (LimitCPU=, LimitFSIZE=)
        return Finding("killed-by-signal", f"{reason}: {entry.meaning}{d.host_note}", base, action=entry.action,
                       signal=sig)
    if sig == 9:
        if not d.kernel_readable:
            reason += f"; kernel log unreadable, OOM not ruled out ({kernel_reason(d.evidence)})"
        else:
            others = list(d.ooms)
            reason += ("; no OOM kill of the run in the kernel log" if not others else
                       f"; the kernel log's OOM kill(s) in the window name other processes ({', '.join(o.get('comm') or '?' for o in others)})")
    lines = base + [line for o in d.ooms for line in o["lines"]] + (d.exc["lines"] if interrupted else [])
    if interrupted:
        reason += "; Python's KeyboardInterrupt traceback is the SIGINT itself, not a crash of the trainer"
    if sig in CLEAN_EXIT_SIGNALS and d.not_restarted:
        reason += f"; systemd counts SIG{SIGNAL_NAMES[sig]} as a clean exit, so {d.not_restarted}"
        return Finding("killed-by-signal", reason + d.host_note, lines, NEXT_OUTSIDE_CLEAN_EXIT,
                       action=entry.action if entry else None, signal=sig)
    return Finding("killed-by-signal", reason + d.host_note, lines, action=entry.action if entry else None, signal=sig)


def crash(d: Death) -> Finding | None:
    """Any other failed end: the last exception whole, else the trainer's own error line, else the
    line a HINTS row knows, else the most specific lines ("unrecognised failure: ...")."""
    facts, app = d.facts, d.app
    if not (d.code in ("exited", "killed", "dumped") or facts["result"] not in (None, "success")):
        return None
    app_xids = [x for x in d.xids if x["application"] or x["kind"] == "info"]
    xid_note = ""
    for kind, what in (("application", "application fault, not hardware"), ("info", "informational, catalog IGNORE")):
        some = [x for x in app_xids if x["kind"] == kind]
        if some:
            xid_note += f"; Xid {some[-1]['code']} ({what}) on {some[-1]['pci']}"
    exc, exit_desc, host_note = d.exc, d.exit_desc, d.host_note
    tail = " ".join(line for _, line in app[-50:])
    if exc:
        hint, action = hint_action(exc["text"])
        if not hint:
            hint, action = hint_action(tail)
        reason = f"{exc['text'][:600]} ({exit_desc}){xid_note}{host_note}"
    else:
        said = grep(app, messages.ERROR_RE)  # the trainer's own one-line account comes first
        hint, action = hint_action(said[1] if said else tail)
        said = said or next(((ts, line) for ts, line in reversed(app) if hint and hint_action(line)[0] == hint),
                            None)
        if said:
            reason = f"{exit_desc}; the output says: {strip_prefix(said[1]).strip()[:240]}{xid_note}{host_note}"
            exc = {"lines": [jline(*said)]}
        else:  # no rule knows it: the most specific lines of each source, the kernel's and systemd's first
            specific = specific_lines(app)
            kernel = [(ts, t) for ts, t in d.scan.get("texts", []) if RE_SPECIFIC.search(t)][-2:]
            manager = d.systemd_said[-2:]
            said = ([f"kernel: {t.strip()[:200]}" for _, t in kernel] + [f"systemd: {t.strip()[:200]}" for _, t in manager]
                    + [strip_prefix(x[1]).strip()[:200] for x in specific])
            reason = (f"unrecognised failure: {' / '.join(said)} ({exit_desc}){xid_note}{host_note}" if said else
                      f"{exit_desc}, no output from the trainer{xid_note}{host_note}")
            lines = [kline(*x) for x in kernel] + [jline(*x) for x in manager] + [jline(*x) for x in specific]
            exc = {"lines": lines} if lines else None
    xid_entry = next((e for x in app_xids[-1:] for e in catalogues.CATALOGUES["xid"] if e.number == x["code"]), None)
    cited = (d.catalogued or ((xid_entry, app_xids[-1]["line"]) if xid_entry else None)
             or ((d.signal_entry, d.exit_desc) if d.signal_entry else None))
    if cited:  # the layer's own catalogue names it, and says what it means where no hint did
        entry, _ = cited
        if not hint:  # an entry that asks nothing (an informational Xid) leaves the death to investigate
            hint, action = entry.said, (entry.action if entry.action != "none" else "investigate")
        if entry.name not in reason:
            reason += f"; {entry.said}"
    if not hint and not d.exc:  # never "fix the exception shown" where there is none
        hint = ("no rule recognises this failure: read the lines shown and evidence.json (the kernel log, systemd's "
                "record, the trainer's output)")
    if hint and "raise MemoryMax" in hint and d.memory_max is None:
        hint = hint.replace("raise MemoryMax", "give the host more memory (the unit sets no MemoryMax=)")
    reason += d.kernel_note
    lines = (d.base + (exc["lines"] if exc else []) + [x["line"] for x in app_xids]
             + [f["line"] for f in d.families if f["entry"].verdict == "crash"][:2])
    return Finding("crash", reason, dedupe(lines, 20), hint, action=action or "investigate",
                   exception=exc.get("head") if exc else None)


def unknown(d: Death) -> Finding:
    """Nothing proves a cause: say what is missing."""
    status, props = d.status, d.props
    gaps = []
    if not (d.evidence.get("journal") or {}).get("readable", True):
        gaps.append("journal unreadable")
    if not d.facts["code"]:
        gaps.append("systemd's exit record is gone (unit unloaded or reset)")
    return Finding("unknown", f"unit is {props.get('ActiveState', '?')} and nothing explains how it ended"
                   + (f": {', '.join(gaps)}" if gaps else f" ({d.exit_desc})")
                   + (f"; status.json last said phase={status.get('phase')} step={status.get('step')}" if status else "")
                   + d.host_note + d.kernel_note,
                   d.base + ([f"status.json: phase={status.get('phase')} updated {fmt_time(status_time(status.get('updated')))}"] if status else []))


# docs/diagnosis.md's precedence list, in its order: the first rule that returns a finding wins.
RULES = (
    clean_exit, hardware_xid, kernel_family, kernel_oom_kill, systemd_oom_kill, exec_failed, start_timeout,
    cuda_oom, shm_full, disk_quota, disk_full, short_write, peer_failure, nccl_timeout, watchdog_hang,
    host_finding, nccl_error, native_crash, config_error, nonfinite_loss, layer_catalogue, outside_signal, crash,
    unknown,
)


def decide(d: Death) -> Finding:
    """The first rule's finding (unknown always has one)."""
    for rule in RULES:
        found = rule(d)
        if found is not None:
            return found
    raise AssertionError("unknown always returns a finding")
