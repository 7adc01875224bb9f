"""`python tests/failure_lines.py LOG`: the lines of a failed `make test` stage's log that say why it
failed, for the end of the output, where CI's excerpt of a long log still shows them.

- Ansible (Molecule's plays): for each play whose recap counts a host `failed`, that host's last
  failure in the play: its task, Ansible's `[ERROR]` message and its `fatal:` result (a line of
  JSON, or YAML's indented lines). Earlier failures are the ones a task expects (a rescue, a check
  that a refusal happens); a real failure ends the host's play, so it is the last. Failures a task
  ignores (`...ignoring`) and retries do not count.
- pytest: its short summary's `FAILED` and `ERROR` lines.
Nothing of these (a lint stage, a crash): the log's last lines.
"""

import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BOX = re.compile(r"^\s*│\s?")  # Molecule in colour frames a play's output in a box's left edge
TASK = re.compile(r"^(TASK|RUNNING HANDLER) \[")
FATAL = re.compile(r"^(?:fatal|failed): \[([^\]]+)\]")
RECAP_FAILED = re.compile(r"^(\S+)\s*:\s.*\bfailed=[1-9]")
PYTEST = re.compile(r"^(FAILED|ERROR) [\w./-]+\.py\b")  # FAILED tests/x.py::test - why
LINE_CHARS = 1500  # a failed task's result holds its whole output; its start says why
ERROR_LINES = 30  # an [ERROR] message quoting a nested playbook's output is cut there
MAX_LINES = 60
TAIL_LINES = 30


def clean(line: str) -> str:
    return BOX.sub("", ANSI.sub("", line.rstrip("\n")))


def failure_lines(lines: list[str]) -> list[str]:
    out, task, error, in_error = [], None, [], False
    last, last_play = {}, {}  # host -> its last failure in this play, in the play before: its lines
    pending = None  # a failure not yet known to be kept (an `...ignoring` line may follow)
    for raw in lines:
        line = clean(raw)
        if pending is not None:
            if line[:1].isspace() and len(pending[1]) < MAX_LINES:  # a result in YAML, line by line
                pending[1].append(line[:LINE_CHARS])
                continue
            if not line.startswith("...ignoring"):
                last[pending[0]] = pending[1]
            pending = None
        if in_error and (not line or line.startswith("Origin:") or len(error) == ERROR_LINES):
            in_error = False  # Ansible's message ends where it names the task's file
        if in_error:
            error.append(line[:LINE_CHARS])
        elif TASK.match(line):
            task, error = line.rstrip(" *"), []
        elif line.startswith("[ERROR]:"):
            error, in_error = [line[:LINE_CHARS]], True
        elif m := FATAL.match(line):
            pending = (m.group(1), [task] * bool(task) + error + [line[:LINE_CHARS]])
        elif line.startswith("PLAY RECAP"):
            last_play, last = last, {}
        elif (m := RECAP_FAILED.match(line)) and m.group(1) in last_play:
            out += last_play.pop(m.group(1))
        elif PYTEST.match(line):
            out.append(line[:LINE_CHARS])
    if not out:
        return [clean(raw) for raw in lines[-TAIL_LINES:]]
    return out[:MAX_LINES]


def main() -> None:
    with open(sys.argv[1], errors="replace") as f:
        print("\n".join(failure_lines(f.readlines())))


if __name__ == "__main__":
    main()
