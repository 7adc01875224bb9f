"""tests/failure_lines.py: the lines that say why a `make test` stage failed, on logs shaped as
ansible-core 2.19, Molecule and pytest print them."""

from tests.failure_lines import failure_lines

# A play whose expected refusal is rescued, then a failure that ends it (its recap counts it).
PLAY = """\
TASK [nvidia_driver : Refuse unsigned modules under Secure Boot] ***************
Saturday 05 December 2026  19:17:37 +0000 (0:00:00.038)       0:00:01.944 *****
[ERROR]: Task failed: Action failed: Secure Boot is on and no module signing key is configured.
Origin: /repo/roles/nvidia_driver/tasks/validate.yml:89:3

fatal: [node-a]: FAILED! => {"assertion": "not nvidia_driver_secure_boot", "changed": false}

TASK [Keep the refusal] ********************************************************
ok: [node-a]

TASK [Optional probe] **********************************************************
fatal: [node-a]: FAILED! => {"changed": false, "msg": "probe absent"}
...ignoring

TASK [Wait for both units to run again] ****************************************
FAILED - RETRYING: [node-a]: Wait for both units to run again (2 retries left).
FAILED - RETRYING: [node-a]: Wait for both units to run again (1 retries left).
[ERROR]: Task failed: Action failed: NRestarts=2
the trainer restarted twice
Origin: /repo/molecule/vllm/verify.yml:93:7

fatal: [node-a]: FAILED! => {"attempts": 3, "changed": false, "stdout": "NRestarts=2"}

PLAY RECAP *********************************************************************
node-a                     : ok=25   changed=1    unreachable=0    failed=1    skipped=0    rescued=1    ignored=1
localhost                  : ok=3    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
"""


def test_a_failed_play_gives_its_last_failure_with_task_and_message():
    assert failure_lines(PLAY.splitlines(keepends=True)) == [
        "TASK [Wait for both units to run again]",
        "[ERROR]: Task failed: Action failed: NRestarts=2",
        "the trainer restarted twice",
        'fatal: [node-a]: FAILED! => {"attempts": 3, "changed": false, "stdout": "NRestarts=2"}',
    ]


def test_a_play_that_recovered_from_its_failures_gives_none_of_them():
    passed = PLAY.replace("failed=1 ", "failed=0 ")
    assert passed != PLAY
    # nothing picked out: the log's last lines
    assert failure_lines(passed.splitlines(keepends=True)) == passed.splitlines()[-30:]


def test_an_ignored_failure_is_not_the_reason():
    ignored_last = PLAY.split("TASK [Wait for both")[0] + "PLAY RECAP ***\nnode-a : ok=3 failed=1\n"
    lines = failure_lines(ignored_last.splitlines(keepends=True))
    assert lines[0] == "TASK [nvidia_driver : Refuse unsigned modules under Secure Boot]"
    assert "probe absent" not in "\n".join(lines)


def test_molecule_colour_and_its_frame_are_taken_off():
    framed = "".join(f"  \x1b[2m│\x1b[0m {line}\n" for line in PLAY.splitlines())
    assert failure_lines(framed.splitlines(keepends=True)) == failure_lines(PLAY.splitlines(keepends=True))


def test_pytest_gives_its_summary_lines_not_retries():
    log = [
        "FAILED - RETRYING: [node-a]: Wait (3 retries left).\n",
        "..F.s\n",
        "=========================== short test summary info ============================\n",
        "FAILED tests/unit/test_x.py::test_y - AssertionError: 3 != 4\n",
        "ERROR tests/unit/test_z.py - ImportError: no module named q\n",
        "1 failed, 3 passed, 1 error in 2.00s\n",
    ]
    assert failure_lines(log) == [log[3].rstrip(), log[4].rstrip()]


def test_a_log_without_failure_lines_gives_its_tail():
    log = [f"roles/x/tasks/main.yml:{i}: yaml[line-length]\n" for i in range(50)]
    assert failure_lines(log) == [line.rstrip() for line in log[-30:]]


def test_a_result_in_yaml_comes_whole():
    log = PLAY.replace(
        'fatal: [node-a]: FAILED! => {"attempts": 3, "changed": false, "stdout": "NRestarts=2"}',
        "fatal: [node-a]: FAILED! =>\n    attempts: 3\n    changed: false\n    stdout: NRestarts=2",
    )
    assert failure_lines(log.splitlines(keepends=True))[-4:] == [
        "fatal: [node-a]: FAILED! =>", "    attempts: 3", "    changed: false", "    stdout: NRestarts=2"]
