"""module_utils/flashfleet/jobwait.py: one wait of a poll, against results files written as Ansible's
async wrapper writes them (the wrapper's "finished": false while the job runs, the job's own result
once it has ended)."""

import json

from flashfleet.jobwait import job_finished, wait, wait_seconds


def test_the_wait_grows_with_the_job_up_to_the_interval():
    assert [wait_seconds(10, e) for e in (0, 0.4, 1.5, 2, 4.9, 9, 10, 600)] == [1, 1, 1, 2, 4, 9, 10, 10]


def test_a_job_is_finished_once_its_results_file_holds_its_own_result(tmp_path):
    results = tmp_path / "123.456"
    assert not job_finished(str(results))  # not written yet
    results.write_text('{"started": true, "fin')  # being written
    assert not job_finished(str(results))
    results.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "123.456"}))
    assert not job_finished(str(results))
    results.write_text(json.dumps({"changed": True, "rc": 0, "stdout": ""}))
    assert job_finished(str(results))


def test_the_wait_ends_within_a_second_of_the_jobs_end(tmp_path):
    results = tmp_path / "job"
    results.write_text(json.dumps({"started": True, "finished": False}))
    slept = []

    def sleep(s):  # the job ends during the third second
        slept.append(s)
        if len(slept) == 3:
            results.write_text(json.dumps({"rc": 0}))

    assert wait(str(results), 60, sleep=sleep) == 3
    assert slept == [1, 1, 1]


def test_a_job_that_runs_on_is_waited_for_the_whole_wait(tmp_path):
    results = tmp_path / "job"
    results.write_text(json.dumps({"started": True, "finished": False}))
    slept = []
    assert wait(str(results), 4, sleep=slept.append) == 4 and slept == [1, 1, 1, 1]
    assert wait("", 2, sleep=slept.append) == 2  # no results file named: the whole wait
