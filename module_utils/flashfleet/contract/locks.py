"""Lock files (requirements/*.lock) and how an installed venv compares with one: one rule set
for the python_env role's drift check and for diagnose's evidence.

A lock line is `name[extras]==version`, optionally followed by `; markers` and `--hash=...`
(continued with `\\`); `#` starts a comment; option lines (`--index-url ...`, `--hash` on a
line of its own) are skipped. Any other line is an error naming the line, so a typo in a lock
is never read as "nothing pinned". Names compare PEP 503-normalized. Versions compare as pip
installs them (PEP 440): a pin without a local label (`2.13.0`) accepts an installed build with
one (`2.13.0+cpu`); a pin with a local label must match exactly.
"""

import re

_COMMENT = re.compile(r"(^|\s)#.*$")  # as pip: `#` at the start or after whitespace
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*===?\s*([^\s,;]+)$")

# Run with the venv's interpreter: {distribution name: version} as the trainer would import it.
LIST_INSTALLED_SCRIPT = (
    "import importlib.metadata as m, json;"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def normalize(name: str) -> str:
    """PEP 503 normalization: 'Pydantic_Core' and 'pydantic-core' are the same distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str) -> dict[str, str]:
    """{normalized name: version}; ValueError names the first line that is not a pin."""
    pins: dict[str, str] = {}
    logical, start, first = "", 1, ""
    for number, raw in enumerate(text.splitlines(), start=1):
        if not logical:
            start, first = number, raw
        line = _COMMENT.sub("", raw)
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        line, logical = logical.strip(), ""
        if not line or line.startswith("-"):
            continue
        line = line.split(" --hash", 1)[0].split(";", 1)[0].strip()
        match = _PIN.match(line)
        if not match:
            raise ValueError(f"line {start} is not a name==version pin: {first.strip()!r}")
        pins[normalize(match.group(1))] = match.group(3)
    if not pins:
        raise ValueError("the lock has no pins")
    return pins


def same_version(locked: str, installed: str | None) -> bool:
    if installed is None:
        return False
    return installed == locked if "+" in locked else installed.split("+", 1)[0] == locked


def compare(locked: dict[str, str], installed: dict[str, str], ignore=()) -> list[dict]:
    """Every locked package missing or at another version, then every unlocked extra:
    [{"package", "locked", "installed"}] (None where there is none)."""
    have = {normalize(k): v for k, v in installed.items()}
    ignored = {normalize(n) for n in ignore}
    drift = [{"package": name, "locked": version, "installed": have.get(name)}
             for name, version in sorted(locked.items()) if not same_version(version, have.get(name))]
    drift += [{"package": name, "locked": None, "installed": version}
              for name, version in sorted(have.items()) if name not in locked and name not in ignored]
    return drift


def table(drift: list[dict]) -> str:
    """The drift as an aligned text table (or the one line saying there is none)."""
    if not drift:
        return "venv matches the lock"
    rows = [("package", "locked", "installed")] + [
        (d["package"], d["locked"] or "(not locked)", d["installed"] or "(missing)") for d in drift]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
