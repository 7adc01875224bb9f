"""`dflash-data`: training data for dflash-train from conversations (docs/data.md).

    dflash-data build --model TARGET --input convs.jsonl [...] --out DATA_DIR
    dflash-data regenerate --model TARGET --server http://HOST:PORT --input convs.jsonl --out DATA_DIR

A bad input is refused in one line with its fix (exit 78) before anything is written; a server
that stops answering mid-regenerate ends it with one line (exit 1): the same command resumes.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from urllib.parse import urlparse

from flashfleet.contract.messages import EX_CONFIG

from .errors import CliParser, ConfigError

# Each number's range: (flag dest, lowest, highest, lowest excluded). Checked before anything is
# read or asked: a nan temperature or a 0 timeout would reach the server with every prompt.
BOUNDS = [("max_len", 1, None, False), ("shard_rows", 1, None, False), ("temperature", 0, None, False),
          ("top_p", 0, 1, True), ("top_k", 0, None, False), ("max_tokens", 1, None, False),
          ("seed", 0, 2**32 - 1, False), ("concurrency", 1, None, False), ("request_timeout", 0, None, True),
          ("progress_s", 0, None, True)]


def parse_args(argv=None) -> argparse.Namespace:
    common = CliParser(add_help=False)
    common.add_argument("--model", required=True, help="the target's HF directory: its tokenizer and chat template")
    common.add_argument("--input", nargs="+", required=True, help="conversations: ShareGPT or OpenAI-messages JSONL or Parquet")
    common.add_argument("--out", required=True, help="the data directory to write (dflash-train --data-dir)")
    common.add_argument("--thinking", choices=("keep", "strip"), default="keep",
                        help="Qwen3-style <think> blocks: keep them (supervised), or strip them and render with thinking off")
    common.add_argument("--per-turn", action="store_true", help="one row per assistant turn (regenerate: one prompt per user turn)")
    common.add_argument("--max-len", type=int, default=8192, help="rows longer are truncated (default 8192)")
    common.add_argument("--shard-rows", type=int, default=10000, help="rows per Parquet shard (default 10000)")
    common.add_argument("--no-dedup", action="store_true", help="keep exact duplicate rows")

    p = CliParser(prog="dflash-data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("build", parents=[common], help="conversations -> Parquet with the target's chat template")
    r = sub.add_parser("regenerate", parents=[common], help="the prompts answered by the target's server, then build")
    r.add_argument("--server", required=True, help="the target's OpenAI-compatible (vLLM) server, http://HOST:PORT")
    r.add_argument("--served-model", default=None, help="the served model's name when the server has several")
    r.add_argument("--temperature", type=float, default=0.7)
    r.add_argument("--top-p", type=float, default=0.95)
    r.add_argument("--top-k", type=int, default=0, help="0: off")
    r.add_argument("--max-tokens", type=int, default=2048, help="per answer (capped by the server's max_model_len)")
    r.add_argument("--seed", type=int, default=0, help="each prompt's seed is this plus a hash of its id")
    r.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    r.add_argument("--request-timeout", type=float, default=600.0)
    r.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines")
    a = p.parse_args(argv)
    for dest, lo, hi, open_lo in BOUNDS:
        v, flag = getattr(a, dest, None), "--" + dest.replace("_", "-")
        if v is None:
            continue  # not a flag of this subcommand
        number = isinstance(v, int | float) and math.isfinite(v)  # `--max-len=--` gives argparse's []
        if not number or v < lo or (open_lo and v == lo) or (hi is not None and v > hi):
            rng = f"{'>' if open_lo else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
            raise ConfigError(f"{flag} {v}: must be a finite number {rng}", f"e.g. {flag} {p_default(p, a, dest)}")
    return a


def p_default(parser: argparse.ArgumentParser, a: argparse.Namespace, dest: str):
    """The subcommand's default of `dest` (for the fix of a refused value)."""
    sub = next(x for x in parser._actions if isinstance(x, argparse._SubParsersAction)).choices[a.command]
    return sub.get_default(dest)


def check_paths(a: argparse.Namespace) -> None:
    """Before the tokenizer loads or the server is asked: the inputs exist, --out can take a build."""
    from .data_build import refuse_existing

    for p in a.input:
        if not Path(p).is_file():
            raise ConfigError(f"--input {p}: no such file", "give JSONL or Parquet files of conversations")
    refuse_existing(Path(a.out))
    if a.command == "regenerate":
        try:
            url = urlparse(a.server)
            ok = url.scheme in ("http", "https") and bool(url.hostname) and url.port != 0
        except ValueError:  # "http://[x", a port that is no number
            ok = False
        if not ok:
            raise ConfigError(f"--server {a.server!r} is not http://HOST:PORT", "e.g. --server http://127.0.0.1:8000")


def run(a: argparse.Namespace, log=print) -> int:
    from .chat_template import ChatTemplate
    from .conversations import read_conversations
    from .data_build import BuildOptions, build

    check_paths(a)
    template = ChatTemplate(a.model, a.thinking)
    opts = BuildOptions(per_turn=a.per_turn, max_len=a.max_len, shard_rows=a.shard_rows, dedup=not a.no_dedup)
    if a.command == "build":
        build(read_conversations(a.input), template, a.out, opts, log)
        return 0
    from .data_regenerate import Sampling, regenerate, regenerated

    sampling = Sampling(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens, seed=a.seed)
    ledger = regenerate(a.input, template, a.server, a.out, sampling, per_turn=a.per_turn, concurrency=a.concurrency,
                        served_model=a.served_model, request_timeout=a.request_timeout, progress_s=a.progress_s,
                        log=log)
    # Regenerated rows are already one per prompt: per_turn was the prompts' choice.
    build(regenerated(ledger), template, a.out, opts, log)
    return 0


def main(argv=None) -> int:
    try:
        a = parse_args(argv)
        return run(a, log=lambda s: print(s, flush=True))
    except ConfigError as e:
        print(e.line(), file=sys.stderr, flush=True)
        return EX_CONFIG
    except Exception as e:
        from .data_regenerate import ServerGoneError

        if not isinstance(e, ServerGoneError):
            raise
        print(f"dflash-data: {e}; run the same command again to resume from its ledger", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
