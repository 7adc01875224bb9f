"""One wait of a poll (the kernel build's, a staging's, a run's start): as long as the job has run
so far (1, 2, 4 ... s), at most the poll's interval, and over within a second of the job's end, so a
job of a few seconds is seen finished after seconds, not after a whole interval. Ansible's async
job writes its results file, which says `"finished": false` until the job ends. Standard library
only: it runs on the host inside the async_job_wait module."""

from __future__ import annotations

import json
import time


def wait_seconds(interval: float, elapsed: float) -> int:
    """How long this look waits: the job's age so far, at least 1 s and at most the interval."""
    return int(min(interval, max(1, elapsed)))


def job_finished(results_file: str) -> bool:
    """The job has ended, as async_status reads its results file: the file is there and whole, and
    holds the job's own result (no `started` key) rather than the wrapper's `"finished": false`."""
    try:
        with open(results_file) as f:
            result = json.load(f)
    except (OSError, ValueError):  # not written yet, or being written
        return False
    return "started" not in result or bool(result.get("finished"))


def wait(results_file: str, seconds: int, sleep=time.sleep) -> int:
    """Wait up to `seconds`, a second at a time, ending early once the job has finished; the seconds
    waited."""
    for waited in range(seconds):
        if results_file and job_finished(results_file):
            return waited
        sleep(1)
    return seconds
