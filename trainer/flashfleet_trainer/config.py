"""The run configuration of `dflash-train`: its command line and checks, derived from one typed definition.

`RunConfig` (flashfleet.plan.settings, below the trainer and the controller) is the definition: one
field per setting in the section that owns it, with its type, default, one-line doc, bounds or
choices; `parse_args` returns a frozen instance of it. The command line (`build_parser`),
`--config PATH.json` loading, `--help`, the range checks (`check_bounds`) and the flag table of
docs/trainer.md (`markdown_table`) are all generated from it; the rules that relate two settings
are in `check_rules`.

A systemd unit runs `dflash-train --config /etc/flashfleet/runs/<run>.json`; the JSON object's
keys are the fields' names ("target_model", "use_soft_labels": true, ...). The command line is
parsed once; a flag given on it overrides the JSON. Deterministic configuration problems raise
ConfigError, which the CLI prints as ONE line and turns into exit code 78 (EX_CONFIG), the code the
unit is told not to restart on.

Who reads what: every module is handed the one frozen RunConfig (`cfg`; the orchestration
modules still call it `args`), which nothing changes after parse_args (planner.py measures with
`cfg.replace(...)`, a copy). The orchestration modules (trainer.py's Trainer and run_rank,
preflight.py, topology.py, planner.py, launch.py) read settings by their flat names, as one
training script would; the others read them through the section that owns them
(`cfg.loss.kl_weight`, `cfg.eval.eval_top_p`), or are handed that section alone
(`feed.wants_final_state(cfg.loss)`). A misspelt name raises AttributeError at its first read, and
tests/unit/test_config_parse.py finds every `cfg.SECTION.NAME` in the package that names no field
of that section.
"""

import argparse
import dataclasses
import difflib
import json
import math
import os
import sys

from flashfleet.plan import gpus
from flashfleet.plan.defaults import BLOCK_SIZE
from flashfleet.plan.settings import FIELDS, RunConfig, base_type  # noqa: F401 (the definition, read through here)

from .errors import CliParser, ConfigError


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def rule(f: dataclasses.Field) -> str:
    """The field's range as its help and its refusal state it: `>= 1`, `> 0`, `in [0, 1)`."""
    m = f.metadata
    lo, hi = (m["ge"], "[") if m["ge"] is not None else (m["gt"], "(")
    up, close = (m["le"], "]") if m["le"] is not None else (m["lt"], ")")
    if lo is not None and up is not None:
        return f"in {hi}{lo}, {up}{close}"
    if lo is not None:
        return f"{'>=' if hi == '[' else '>'} {lo}"
    if up is not None:
        return f"{'<=' if close == ']' else '<'} {up}"
    return ""


def help_text(f: dataclasses.Field) -> str:
    most = f"at most {f.metadata['most']}" if f.metadata["most"] is not None else ""
    extra = "; ".join(x for x in (rule(f), most, f.metadata["note"]) if x)
    return f.metadata["doc"] + (f" ({extra})" if extra else "")


# ---- generated: the command line ---------------------------------------------------------------



def build_parser(given_only: bool = False) -> argparse.ArgumentParser:
    """dflash-train's command line. given_only: no defaults, so that a parse holds only the flags
    given (parse_args puts them over --config's JSON and the fields' defaults); --help is the same."""
    p = CliParser(
        prog="dflash-train",
        description="Train a DFlash block-diffusion drafter on hidden states of a frozen target model.",
        epilog="Exit codes: 0 finished, or stopped by SIGTERM after saving a checkpoint; 78 configuration "
               "error, including a malformed command line (one line on stderr); 65 the loss or gradient norm "
               "became NaN or infinite (one line on stderr; no checkpoint of that state is saved); anything "
               "else is a crash with a traceback.",
    )
    groups = {}
    for f in FIELDS.values():
        group = groups.get(f.metadata["group"]) or groups.setdefault(
            f.metadata["group"], p.add_argument_group(f.metadata["group"]))
        add_setting(group, f.name, default=argparse.SUPPRESS if given_only else dataclasses.MISSING)
    return p


def add_setting(parser: argparse.ArgumentParser, name: str, *aliases: str, default=dataclasses.MISSING,
                use: str = "") -> None:
    """Another command's flag for the same setting (dflash-eval's), from the same field: its type,
    choices and doc with range; `aliases` keep that command's older names, `default` overrides the
    field's (the field's doc says why), `use` says what the setting is for there. Check the parsed
    values with check_bounds."""
    f = FIELDS[name]
    kw = dict(dest=name, default=f.default if default is dataclasses.MISSING else default,
              help=(help_text(f) + (f"; {use}" if use else "")).replace("%", "%%"))
    if base_type(f) is bool:  # --x sets it, --no-x clears it: a default of true can be turned off
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw["type"] = None if base_type(f) is str else base_type(f)
        kw.update({k: f.metadata[k] for k in ("choices", "metavar") if f.metadata[k] is not None})
    parser.add_argument(flag(name), *aliases, **kw)


def parse_args(argv=None) -> RunConfig:
    """argv -> the run's frozen RunConfig, parsed once: each setting is its flag when given, else
    its --config JSON key, else its field's default; then checked. Raises ConfigError."""
    parser = build_parser(given_only=True)
    given = vars(parser.parse_args(numbers_as_values(parser, list(sys.argv[1:] if argv is None else argv))))
    values = {name: f.default for name, f in FIELDS.items()}
    if given.get("config"):
        values.update(load_config_file(given["config"]))
    first = argparse.Namespace(**{**values, **given})  # checked (and completed) here, then frozen
    for f in FIELDS.values():
        if f.metadata["required"] and not getattr(first, f.name):
            raise ConfigError(f"{flag(f.name)} is required", f"pass it or set \"{f.name}\" in --config")
    check_types(first)
    kind_defaults(first)
    check_bounds(first)
    check_rules(first)
    return RunConfig.from_flat(vars(first))


def kind_defaults(args) -> None:
    """Fill the settings whose default depends on --drafter-kind (None until here, so a value given
    in flags or --config always wins): --block-size (defaults.BLOCK_SIZE)."""
    if args.block_size is None:
        args.block_size = BLOCK_SIZE[args.drafter_kind]


def load_config_file(path: str) -> dict:
    """--config's JSON object -> {field name: value}: known keys only, each of its field's JSON type
    (a JSON string of a number field is converted as its flag's value is; its bounds are checked
    after the merge, like a flag's)."""
    try:
        with open(path) as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read --config {path}: {e}", "point --config at a readable JSON file") from e
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path} is not a JSON object", "write {\"flag_dest\": value, ...}")
    known = sorted(set(FIELDS) - {"config"})
    for key in sorted(values):
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            raise ConfigError(f"unknown key {key!r} in --config {path}",
                              f"did you mean {near[0]!r}?" if near else "use field names such as target_model, "
                              "use_soft_labels (dflash-train --help; the flag without -- and with _)")
    out = {}
    for key, v in values.items():
        want = base_type(FIELDS[key])
        if want in (int, float) and isinstance(v, str):
            try:
                v = want(v)
            except ValueError:
                raise ConfigError(f"--config key {key}: invalid {want.__name__} value: {v!r}",
                                  f"write \"{key}\": a number") from None
        if want is bool and not isinstance(v, bool):
            raise ConfigError(f"--config key {key} must be true or false", f"write \"{key}\": true")
        if want is str and v is not None and not isinstance(v, str):
            if key == "wandb_settings" and isinstance(v, dict):
                v = json.dumps(v)
            elif isinstance(v, int | float) and not isinstance(v, bool):
                v = str(v)  # "target_gpus": 0 means "0"
            else:
                raise ConfigError(f"--config key {key} {v!r} is not a string", f"write \"{key}\": \"...\"")
        out[key] = v
    return out


def numbers_as_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--lr -1e-3` -> `--lr=-1e-3`: a number after a flag that takes one value is that value.

    argparse reads `-1e-3` (but not `-1`) as an unknown option; joined, the value reaches
    check_bounds, whose message names the flag and its range."""
    takes_value = {s for act in parser._actions if act.nargs is None and act.option_strings
                   for s in act.option_strings}
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return out + argv[i:]
        if tok in takes_value and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            try:
                float(argv[i + 1])
            except ValueError:
                pass
            else:
                out.append(f"{tok}={argv[i + 1]}")
                i += 2
                continue
        out.append(tok)
        i += 1
    return out


# ---- generated: the checks -----------------------------------------------------------------------

def check_types(args) -> None:
    """--config values bypass argparse's conversion (a JSON string is converted, a number, a list or
    null is not): every numeric field must hold a number of its type, every choice one of its
    choices. Integral floats become ints, ints of a float field floats."""
    for f in FIELDS.values():
        v, name, want = getattr(args, f.name, None), flag(f.name), base_type(f)
        if v is None and f.default is None:
            continue
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            if isinstance(v, float) and v.is_integer():
                setattr(args, f.name, int(v))
                continue
            raise ConfigError(f"{name} {v!r} is not an integer", f"pass {name} as a whole number")
        if want is float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"{name} {v!r} is not a number", f"pass {name} as a number, e.g. {f.default}")
            setattr(args, f.name, float(v))
        choices = f.metadata["choices"]
        if choices is not None and v not in choices:
            raise ConfigError(f"{name} {v!r} is not one of {', '.join(choices)}", f"pass {name} {choices[0]}")


def check_bounds(args) -> None:
    """Every field's own range, from its definition: a float must be finite, a bounded number inside
    its bounds (None passes where None is the default). Raises ConfigError naming the flag, the value
    and the range."""
    for f in FIELDS.values():
        v, m, name = getattr(args, f.name, None), f.metadata, flag(f.name)
        if v is None or base_type(f) not in (int, float):
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):  # `--lr=--` gives argparse's [] (dflash-eval)
            raise ConfigError(f"{name} {v!r} is not a number", f"pass {name} as a number, e.g. {m['example']}")
        if not math.isfinite(v):
            raise ConfigError(f"{name} {v} is not a finite number", f"pass {name} as a finite number")
        inside = ((m["ge"] is None or v >= m["ge"]) and (m["gt"] is None or v > m["gt"])
                  and (m["le"] is None or v <= m["le"]) and (m["lt"] is None or v < m["lt"]))
        if not inside:
            raise ConfigError(f"{name} {v}: must be {rule(f)}", m["fix"] or f"e.g. {name} {m['example']}")
        if m["most"] is not None and v > m["most"]:
            raise ConfigError(f"{name} {v}: must be {rule(f)} and at most {m['most']}", f"e.g. {name} {m['example']}")


def check_rules(args) -> None:
    """The rules that relate settings to each other or to the filesystem (a field's own range is
    check_bounds')."""

    def need(cond, what, fix):
        if not cond:
            raise ConfigError(what, fix)

    need(args.max_seq_len <= args.token_budget, f"--max-seq-len {args.max_seq_len} exceeds --token-budget "
         f"{args.token_budget}: such sequences could never be packed", "raise --token-budget or lower --max-seq-len")
    need(0 <= args.node_rank < args.nnodes, f"--node-rank {args.node_rank} is not in "
         f"0..{args.nnodes - 1} (--nnodes {args.nnodes})", "number the nodes 0..nnodes-1")
    if args.nnodes > 1 or args.rdzv_endpoint:
        endpoint = args.rdzv_endpoint
        if not endpoint and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        host, _, port = (endpoint or "").rpartition(":")
        need(bool(host) and port.isdigit() and 0 < int(port) < 65536, f"--rdzv-endpoint {endpoint!r} is not "
             "HOST:PORT", "pass --rdzv-endpoint node0.example:29400 (or set MASTER_ADDR and MASTER_PORT)")
        args.rdzv_endpoint = endpoint
    need(args.resume in ("auto", "never") or os.path.isdir(args.resume), f"--resume {args.resume}: not auto, "
         "never, or an existing checkpoint directory", "pass auto, never, or checkpoints/step-XXXXXXXX")
    need(args.init_from is None or os.path.isdir(args.init_from), f"--init-from {args.init_from}: not a directory",
         "pass a DFlash drafter directory (config.json + model.safetensors), e.g. dflash-export's OUT_DIR")


# ---- generated: the flag table of docs/trainer.md --------------------------------------------------

def markdown_table() -> str:
    """The settings as docs/trainer.md's flag table, one table per group (`python -m
    flashfleet_trainer.config --markdown` prints it; a test fails when the doc differs)."""
    out, group = [], None
    for f in FIELDS.values():
        if f.metadata["group"] != group:
            group = f.metadata["group"]
            out += ["", f"**{group}**", "", "| flag / `--config` key | type | default | range | meaning |",
                    "|---|---|---|---|---|"]
        choices = f.metadata["choices"]
        allowed = " \\| ".join(choices) if choices else "; ".join(x for x in (rule(f), f.metadata["note"]) if x)
        default = "" if f.default is None else json.dumps(f.default)
        cells = [f"`{flag(f.name)}` / `{f.name}`", base_type(f).__name__, f"`{default}`" if default else "",
                 allowed, f.metadata["doc"].replace("|", "\\|")]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out[1:]) + "\n"


def parse_devices(spec: str, flag: str) -> list[str]:
    """'cpu' -> ['cpu']; 'cpu,cpu' -> ['cpu', 'cpu'] (two CPU workers); '0,1,2' -> ['cuda:0', 'cuda:1', 'cuda:2'].

    The grammar is the run plan's (flashfleet.plan.gpus). CPU entries may repeat because each entry
    is a process, and tests need several on one machine; a GPU index may not, because two processes
    of the same role on one GPU only fight for it.
    """
    try:
        found = gpus.entries(str(spec).strip())
    except ValueError:
        found = None
    if found and all(x == "cpu" for x in found):
        return ["cpu"] * len(found)
    if found is None or "cpu" in found:
        raise ConfigError(f"{flag} {spec!r} is not `cpu` or a comma-separated list of GPU indices",
                          f"e.g. {flag} 0,1,2 or {flag} cpu")
    if len(set(found)) != len(found):
        raise ConfigError(f"{flag} {spec!r}: need distinct non-negative GPU indices", f"e.g. {flag} 0,1")
    return [f"cuda:{i}" for i in found]


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m flashfleet_trainer.config --markdown")
    sys.stdout.write(markdown_table())
