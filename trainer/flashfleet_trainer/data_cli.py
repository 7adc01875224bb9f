"""`dflash-data`: training data for dflash-train from conversations (docs/data.md).

    dflash-data build --model TARGET --input convs.jsonl [...] --out DATA_DIR
    dflash-data regenerate --model TARGET --server http://HOST:PORT --input convs.jsonl --out DATA_DIR

A bad input is refused in one line with its fix (exit 78) before anything is written; a server
that stops answering mid-regenerate ends it with one line (exit 1): the same command resumes.
"""

from __future__ import annotations

import argparse
import sys

from flashfleet.contract.messages import EX_CONFIG

from .errors import ConfigError


def parse_args(argv=None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", required=True, help="the target's HF directory: its tokenizer and chat template")
    common.add_argument("--input", nargs="+", required=True, help="conversations: ShareGPT or OpenAI-messages JSONL or Parquet")
    common.add_argument("--out", required=True, help="the data directory to write (dflash-train --data-dir)")
    common.add_argument("--thinking", choices=("keep", "strip"), default="keep",
                        help="Qwen3-style <think> blocks: keep them (supervised), or strip them and render with thinking off")
    common.add_argument("--per-turn", action="store_true", help="one row per assistant turn (regenerate: one prompt per user turn)")
    common.add_argument("--max-len", type=int, default=8192, help="rows longer are truncated (default 8192)")
    common.add_argument("--shard-rows", type=int, default=10000, help="rows per Parquet shard (default 10000)")
    common.add_argument("--no-dedup", action="store_true", help="keep exact duplicate rows")

    p = argparse.ArgumentParser(prog="dflash-data", description=__doc__.split("\n")[0])
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
    for flag in ("max_len", "shard_rows"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    return a


def run(a: argparse.Namespace, log=print) -> int:
    from .chat_template import ChatTemplate
    from .conversations import read_conversations
    from .data_build import BuildOptions, build

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
    a = parse_args(argv)
    try:
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
