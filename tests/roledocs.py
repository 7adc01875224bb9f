"""A role's variables are written once, in its meta/argument_specs.yml; this writes the other two
descriptions of them from it: defaults/main.yml (each variable's value under its description as a
comment) and the variable table of the role's README.md (between its generated-block markers).

    python -m tests.roledocs [ROLE ...]           # rewrite the roles' generated files (make role-docs)
    python -m tests.roledocs --check [ROLE ...]   # list the stale ones, exit 1 if any

Why the spec and not the defaults: the spec says what a defaults file cannot (types, required,
choices, no_log, nested options, the role's entry points and which variables each reads) and holds
the values and descriptions too; docs/architecture.md, "Role variables".

The defaults value of an option is its `default`; a required option (Ansible refuses a default
beside `required`) gets its type's empty value, as the role's tasks expect a defined variable.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FIX = "make role-docs"
WIDTH = 100  # of a generated defaults line
BEGIN = "<!-- variables: generated from meta/argument_specs.yml by `make role-docs`; edit that file, not this table -->"
END = "<!-- end of generated variables -->"
_EMPTY = {"str": "", "path": "", "raw": "", "dict": {}, "list": []}
_PLAIN_START = tuple("{[*&!|>'\"%@`#-?:,")


class SpecError(ValueError):
    """A spec the generator cannot write from: one line naming the role, the option and the fix."""


def roles(root: Path = ROOT) -> list[Path]:
    """The roles that have variables: those with a meta/argument_specs.yml."""
    return sorted(p.parent.parent for p in (root / "roles").glob("*/meta/argument_specs.yml"))


def load(role: Path) -> dict:
    """The role's entry points, {name: spec}."""
    return (yaml.safe_load((role / "meta/argument_specs.yml").read_text()) or {}).get("argument_specs") or {}


def description(option: dict) -> list[str]:
    """An option's description as paragraphs (Ansible allows a string or a list of them)."""
    d = option.get("description") or []
    return [" ".join(p.split()) for p in ([d] if isinstance(d, str) else d) if p.strip()]


def variables(role: Path, entry_points: dict) -> dict[str, dict]:
    """Every variable of the role, in the order the entry points first list it, with the first
    listing's option; its defaults value goes under the key `value`."""
    out: dict[str, dict] = {}
    for ep, spec in entry_points.items():
        for name, option in ((spec or {}).get("options") or {}).items():
            where = f"{role.name}: {name} (entry point {ep})"
            if not description(option):
                raise SpecError(f"{where} has no description: write one in meta/argument_specs.yml")
            if option.get("required") and "default" in option:
                raise SpecError(f"{where} is required and has a default: Ansible refuses both, keep one")
            if "default" in option:
                value = option["default"]
            elif option.get("required") and option.get("type", "str") in _EMPTY:
                value = _EMPTY[option.get("type", "str")]
            else:
                raise SpecError(f"{where} has no default: give it one, or required: true")
            if name not in out:
                out[name] = {**option, "value": value}
            elif out[name]["value"] != value:
                raise SpecError(f"{where}: default {value!r}, another entry point's {out[name]['value']!r}: "
                                "give the variable one value (a YAML alias of its first option)")
    return out


# ---- defaults/main.yml --------------------------------------------------------------------------

def scalar(v) -> str:
    """A YAML scalar: plain where it reads back as itself, else double-quoted (JSON is valid YAML)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return repr(v)
    if v and not v.startswith(_PLAIN_START) and v == v.strip() and not any(t in v for t in (": ", " #", "{{")) \
            and yaml.safe_load(f"k: {v}") == {"k": v}:  # Jinja is quoted, as Ansible's style has it
        return v
    return json.dumps(v, ensure_ascii=False)


def flow(v) -> str:
    """A value on one line: [a, b], {k: v}."""
    if isinstance(v, list):
        return "[" + ", ".join(flow(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {flow(x)}" for k, x in v.items()) + "}"
    return scalar(v)


def fold(v: str, indent: int) -> list[str] | None:
    """A long one-line string as a folded scalar's lines, broken at its spaces (a line break folds
    back to one space); None where it would not read back as itself."""
    if "  " in v or v != v.strip():  # a break there would leave a trailing space
        return None
    lines: list[str] = []
    for word in v.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= WIDTH - indent:
            lines[-1] += " " + word
        else:
            lines.append(word)
    lines = [" " * indent + line for line in lines]
    return lines if len(lines) > 1 and yaml.safe_load("k: >-\n" + "\n".join(lines)) == {"k": v} else None


def block(key: str, v, indent: int = 0) -> list[str]:
    """`key: value` lines: scalars and short collections on the key's line, a list of scalars
    wrapped in flow style, dicts and lists of dicts in block style, a multi-line string literal."""
    pad = " " * indent
    head = f"{pad}{key}:"
    if isinstance(v, str) and "\n" in v.rstrip("\n") and v.endswith("\n"):
        return [f"{head} |", *(f"{pad}  {line}" for line in v.rstrip("\n").split("\n"))]
    if isinstance(v, str) and len(f"{head} {scalar(v)}") > WIDTH and (folded := fold(v, indent + 2)):
        return [f"{head} >-", *folded]
    if not isinstance(v, list | dict) or not v or len(f"{head} {flow(v)}") <= WIDTH and not any(
            isinstance(x, dict | list) and x for x in (v.values() if isinstance(v, dict) else v)):
        return [f"{head} {flow(v)}"]
    if isinstance(v, dict):
        return [head, *(line for k, x in v.items() for line in block(k, x, indent + 2))]
    if all(not isinstance(x, list | dict) for x in v):
        lines, cont = [f"{head} ["], " " * (len(head) + 2)
        for i, x in enumerate(v):
            item = scalar(x) + ("," if i < len(v) - 1 else "]")
            if len(lines[-1]) + 1 + len(item) > WIDTH and not lines[-1].endswith("["):
                lines.append(cont + item)
            else:
                lines[-1] += ("" if lines[-1].endswith("[") else " ") + item
        return lines
    lines = [head]
    for x in v:  # a list of dicts: "- k: v" with the rest of the dict under it
        item = block("_", x, indent + 2)[1:] if isinstance(x, dict) else [f"{pad}  {flow(x)}"]
        lines += [f"{pad}- {item[0].lstrip()}", *item[1:]]
    return lines


def comment(paragraphs: list[str], width: int = WIDTH) -> list[str]:
    out = []
    for i, p in enumerate(paragraphs):
        out += (["#"] if i else []) + ["# " + line for line in textwrap.wrap(p, width - 2, break_on_hyphens=False)]
    return out


def defaults_text(role: Path, entry_points: dict) -> str:
    lines = ["---", f"# Generated from meta/argument_specs.yml by `{FIX}`: edit that file, not this one."]
    for name, option in variables(role, entry_points).items():
        entry = block(name, option["value"])
        if not name.startswith(role.name + "_"):  # the project's shared names (flashfleet_contract)
            entry[0] += "  # noqa: var-naming[no-role-prefix]"
        lines += ["", *comment(description(option)), *entry]
    text = "\n".join(lines) + "\n"
    values = {name: option["value"] for name, option in variables(role, entry_points).items()}
    if (yaml.safe_load(text) or {}) != values:  # the writer's own check: the file reads back as the spec
        raise SpecError(f"{role.name}: defaults/main.yml would not read back as the spec's values (a generator bug)")
    return text


# ---- README.md's variable table -----------------------------------------------------------------

def cell(text: str) -> str:
    """A table cell: `|` escaped everywhere, and outside code spans `<` (an HTML tag to Markdown)
    and `*` (emphasis)."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace("*", "\\*") for i, p in enumerate(parts))


def kind(option: dict) -> str:
    k = option.get("type", "str")
    if option.get("elements"):
        k += f" of {option['elements']}"
    if option.get("choices"):
        k += ": " + ", ".join(f"`{c}`" for c in option["choices"])
    return k + (", no_log" if option.get("no_log") else "")


def shown(v) -> str:
    """A default as the table shows it: `value`, or where the file has it for a long one."""
    if isinstance(v, str) and "\n" in v:
        return "see defaults/main.yml"
    text = scalar(v) if v == "" else (v if isinstance(v, str) else flow(v))
    return f"`{text}`" if len(text) <= 80 else "see defaults/main.yml"


def rows(prefix: str, options: dict) -> list[str]:
    """A row per option and per nested option (`parent.child`), in the spec's order."""
    out = []
    for name, option in options.items():
        default = "required" if option.get("required") else shown(option["default"]) if "default" in option else ""
        out.append("| " + " | ".join(cell(c) for c in (
            f"`{prefix}{name}`", kind(option), default, " ".join(description(option)))) + " |")
        out += rows(f"{prefix}{name}.", option.get("options") or {})
    return out


def readme_block(role: Path, entry_points: dict) -> str:
    listed = variables(role, entry_points)
    lines = [BEGIN]
    if len(entry_points) > 1:  # which variables each entry point (tasks_from) reads
        lines.append("")
        for ep, spec in entry_points.items():
            names = list((spec or {}).get("options") or {})
            reads = "every variable below" if set(names) == set(listed) else ", ".join(f"`{n}`" for n in names)
            lines.append(f"- `{ep}`: {(spec or {}).get('short_description', '')}; reads {reads}.")
    top = {n: o if o.get("required") else {**o, "default": o["value"]} for n, o in listed.items()}
    lines += ["", "| variable | type | default | meaning |", "| --- | --- | --- | --- |", *rows("", top)]
    return "\n".join([*lines, END])


def readme_text(role: Path, entry_points: dict, current: str) -> str:
    if BEGIN not in current or END not in current:
        raise SpecError(f"{role.name}/README.md has no generated variables block: put the lines\n{BEGIN}\n"
                        f"{END}\nunder its `## Variables` heading and run `{FIX}`")
    head, rest = current.split(BEGIN, 1)
    return head + readme_block(role, entry_points) + rest.split(END, 1)[1]


# ---- the files -----------------------------------------------------------------------------------

def generated(role: Path) -> dict[Path, str]:
    """{path: the text the generator writes there now} for one role."""
    entry_points = load(role)
    readme = role / "README.md"
    return {role / "defaults/main.yml": defaults_text(role, entry_points),
            readme: readme_text(role, entry_points, readme.read_text())}


def stale(root: Path = ROOT) -> list[Path]:
    """The generated files that differ from what the generator writes now."""
    return [p for role in roles(root) for p, text in generated(role).items()
            if not p.exists() or p.read_text() != text]


def main(argv: list[str]) -> int:
    check = argv[:1] == ["--check"]
    names = argv[1:] if check else argv
    known = {r.name: r for r in roles(ROOT)}
    if unknown := [n for n in names if n not in known]:
        print(f"roledocs: no role {', '.join(unknown)} with a meta/argument_specs.yml; roles: {', '.join(known)}",
              file=sys.stderr)
        return 2
    try:  # every file is worked out before any is written: a bad spec changes nothing
        files = {p: text for n in (names or known) for p, text in generated(known[n]).items()}
    except SpecError as e:
        print(f"roledocs: {e}", file=sys.stderr)
        return 78
    changed = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    for p in changed:
        if check:
            print(f"{p.relative_to(ROOT)}: stale, run `{FIX}`")
        else:
            p.parent.mkdir(exist_ok=True)
            p.write_text(files[p])
            print(f"wrote {p.relative_to(ROOT)}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
