"""Advice only where its evidence holds: each case is a confident answer the classifier once gave
next to evidence that contradicted it, built with the hand-built fixtures' helpers, and the
answer it must give now (and, where a setting decides, the other side of that setting)."""

from __future__ import annotations

from flashfleet import classify as fc

from tests.fixtures.evidence import handbuilt as hb

HEAD = [hb.starting(hb.T0), *hb.loading(hb.T0), hb.started(hb.T0 + 55)]
TB = '  File "/srv/venv/lib/python3.12/site-packages/flashfleet_trainer/trainer.py", line 412, in main'


def died(lines, *, code="exited", status=1, result="exit-code", name=None, kernel=(), memory_max="infinity",
         t=hb.T0 + 3000, **evidence):
    """A run that was READY and then died at t with these output lines (entries) and kernel lines."""
    props = hb.props("failed", "failed", result, {"exited": "1", "killed": "2"}[code], str(status), exit_=t + 1)
    props["MemoryMax"] = memory_max
    entries = HEAD + list(lines) + [hb.main_exit(t + 1, code, status, name), hb.failed_result(t + 1, result)]
    return hb.evidence("t", unit_props=props, entries=entries, kernel=kernel,
                       status=hb.status("training", 2990, True, t - 5), **evidence)


def said(result: dict) -> str:
    return " ".join([result["reason"], result["next_step"]])


def test_no_memory_limit_advice_without_a_limit():
    lines = hb.traceback(hb.T0 + 2999, [TB], "OSError: [Errno 12] Cannot allocate memory")
    unlimited = fc.classify(died(lines))
    assert "raise MemoryMax" not in said(unlimited) and "sets no MemoryMax" in unlimited["next_step"], unlimited
    limited = fc.classify(died(lines, memory_max="34359738368"))
    assert "raise MemoryMax" in limited["next_step"], limited


def test_an_oom_kill_of_a_unit_without_memory_max_names_the_limit_above_it():
    result = fc.classify(died([], code="killed", status=9, result="oom-kill", name="KILL"))
    assert result["verdict"] == "cgroup-oom-kill", result
    assert "sets no MemoryMax=" in result["reason"] and "MemoryMax" not in result["next_step"], result


def test_systemd_oomd_is_memory_pressure_not_a_limit():
    oomd = hb.pid1(hb.T0 + 3000.5, f"{hb.UNIT}: systemd-oomd killed 5 process(es) in this unit.")
    result = fc.classify(died([oomd], code="killed", status=9, result="signal", name="KILL"))
    assert (result["verdict"], result["action"]) == ("cgroup-oom-kill", "fix-config"), result
    assert "systemd-oomd" in result["reason"] and "MemoryMax" not in result["next_step"], result


def test_enospc_with_space_free_is_inodes_or_another_filesystem():
    lines = hb.traceback(hb.T0 + 2999, [TB], "OSError: [Errno 28] No space left on device: '/tmp/tmpab12/shard'")
    ev = died(lines)
    ev["disk"]["output_dir"].update(free_inodes=12, total_inodes=6_553_600)
    inodes = fc.classify(ev)
    assert inodes["verdict"] == "disk-full" and "out of inodes" in inodes["reason"], inodes
    ev["disk"]["output_dir"].update(free_inodes=6_000_000)
    other = fc.classify(ev)
    assert "another filesystem" in other["reason"] and "free space on the output" not in other["next_step"], other
    full = died(lines, free=10 * 2**20)  # the run's filesystem is full: then freeing it is the advice
    assert "free space" in fc.classify(full)["next_step"]


def test_a_stale_exec_main_record_is_not_this_deaths():
    """systemd keeps the previous process's ExecMainStatus until the next exits; the journal holds this one's."""
    t = hb.T0 + 3000
    props = hb.props("failed", "failed", "exit-code", "1", "3", start=hb.T0 + 10, exit_=hb.T0 - 31)
    entries = HEAD + hb.traceback(t - 1, [TB], "KeyError: 'lm_head.weight'") + [
        hb.main_exit(t, "exited", 1), hb.failed_result(t, "exit-code")]
    result = fc.classify(hb.evidence("t", unit_props=props, entries=entries,
                                     status=hb.status("training", 2990, True, t - 5)))
    assert "exit status 1" in result["reason"] and "exit status 3" not in result["reason"], result
    assert " -" not in result["reason"].split("after start")[0][-8:], result


def test_no_negative_time_after_start():
    props = hb.props("failed", "failed", "exit-code", "1", "1", start=hb.T0 + 60, exit_=hb.T0 + 5)
    entries = [hb.starting(hb.T0 + 60), *hb.traceback(hb.T0 + 61, [TB], "KeyError: 'x'")]
    result = fc.classify(hb.evidence("t", unit_props=props, entries=entries))
    assert result["verdict"] == "init-crash" and "-" not in result["reason"].split("s after start")[0][-6:], result


def test_an_exception_is_kept_across_a_blank_line_of_its_message():
    fix = "To fix it, pass trust_remote_code=True or install the model's code (see the model card)."
    lines = [*hb.traceback(hb.T0 + 2999, [TB], "ValueError: The checkpoint you are trying to load has model type "
                           "`qwen9` but Transformers does not recognize this architecture."),
             hb.out(hb.T0 + 2999.01, ""), hb.out(hb.T0 + 2999.02, fix)]
    result = fc.classify(died(lines))
    assert fix in result["reason"], result["reason"]


def test_a_keyboard_interrupt_is_its_sigint_not_a_crash():
    lines = hb.traceback(hb.T0 + 2999, [TB], "KeyboardInterrupt")
    result = fc.classify(died(lines, code="killed", status=2, result="signal", name="INT"))
    assert result["verdict"] == "killed-by-signal" and "SIGINT" in result["reason"], result


def test_a_kernel_hang_line_is_quoted_and_nothing_says_fix_the_exception():
    hung = hb.kmsg(hb.T0 + 2900, "INFO: task python3:4242 blocked for more than 120 seconds.")
    result = fc.classify(died([], kernel=[hung]))
    assert "blocked for more than 120 seconds" in result["reason"], result
    assert "exception" not in result["next_step"], result


def test_a_watchdog_kill_after_a_hung_task_reboots_the_node():
    hung = hb.kmsg(hb.T0 + 2900, "INFO: task python3:4242 blocked for more than 120 seconds.")
    result = fc.classify(died([], code="killed", status=6, result="watchdog", name="ABRT", kernel=[hung]))
    assert (result["verdict"], result["action"]) == ("watchdog-hang", "reboot-node"), result
    plain = fc.classify(died([], code="killed", status=6, result="watchdog", name="ABRT"))
    assert (plain["verdict"], plain["action"]) == ("watchdog-hang", "rerun"), plain


def test_a_corrected_machine_check_is_not_a_death():
    """Bit 61 (UC) clear: the hardware corrected it; the crash stays the trainer's."""
    corrected = hb.kmsg(hb.T0 + 2990, "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: 9c00000000010091")
    lines = hb.traceback(hb.T0 + 2999, [TB], "KeyError: 'lm_head.weight'")
    assert fc.classify(died(lines, kernel=[corrected]))["verdict"] == "crash"
    uncorrected = hb.kmsg(hb.T0 + 2990, "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: bc00000000010091")
    assert fc.classify(died(lines, kernel=[uncorrected]))["verdict"] == "host-hardware-error"


def test_an_unrecognised_failure_ranks_each_sources_lines_kernel_first():
    nvme = hb.kmsg(hb.T0 + 2998, "nvme0n1: I/O Cmd(0x2) @ LBA 8192, 8 blocks, I/O Error (sct 0x2 / sc 0x81)")
    lines = [hb.out(hb.T0 + 2999, "loader: shard 12 failed its read, giving up")]
    result = fc.classify(died(lines, kernel=[nvme]))
    reason = result["reason"]
    assert reason.startswith("unrecognised failure: kernel: nvme0n1") and "shard 12 failed" in reason, reason
    assert any("nvme0n1" in line for line in result["evidence"]), result["evidence"]
