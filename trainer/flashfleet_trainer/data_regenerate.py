"""`dflash-data regenerate`: the prompts answered again by the target, through its vLLM server.

Why: a drafter learns to predict the target, so its data should be the target's own answers, not
another model's (docs/data.md).

Exact tokens: the prompt is rendered by the target's chat template here and sent as token ids to
`/v1/completions` with `return_token_ids`; the answer's token ids come back as sampled. Neither side
is re-tokenized from text (a decoded answer does not always tokenize back to the sampled ids), and
the server needs no tokenizer of its own (it may run with --skip-tokenizer-init).
`/v1/chat/completions` would render on the server and answer in text: it is not used.

Prompts: each conversation up to its last user turn (`per_turn`: one prompt per user turn, with the
original history before it); what followed is replaced by the target's answer.

The ledger, OUT/regenerate/responses.jsonl: one line per answered prompt (its id, the messages with
the answer, prompt_ids, completion_ids, finish_reason), appended in one write and fsynced before
the next. A rerun reads it, drops a line cut by a kill, and asks only for the ids not in it: nothing
is asked twice, nothing lost. The sampling settings are in OUT/regenerate/settings.json; a rerun
with other settings or other inputs is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from .chat_template import ChatTemplate
from .conversations import read_conversations
from .errors import ConfigError

WORK_DIR = "regenerate"
LEDGER = "responses.jsonl"
SETTINGS = "settings.json"


class ServerGoneError(RuntimeError):
    """The server stopped answering mid-run: rerun the same command to resume."""


@dataclass
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0  # 0: off
    max_tokens: int = 2048
    seed: int = 0


# ---- the server ------------------------------------------------------------------------------------

def _call(url: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    """GET (body None) or POST JSON. HTTPError (the server answered: 4xx/5xx) is raised as is;
    no answer at all is ServerGoneError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError:
        raise
    except OSError as e:
        raise ServerGoneError(f"server {url} did not answer ({e})") from e
    except ValueError as e:  # an HTML page: something other than an OpenAI-compatible server
        answer = e
    if not isinstance(answer, dict):
        raise ConfigError(f"server {url} answered something not a JSON object ({' '.join(str(answer).split())[:80]}): "
                          "that is no OpenAI-compatible (vLLM) server", "give --server the target's vLLM server, "
                          "http://HOST:PORT")
    return answer


def _http_detail(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
        msg = body.get("error", body)
        return str(msg.get("message", msg) if isinstance(msg, dict) else msg)[:300]
    except Exception:
        return str(e)


def _config(model_dir: Path) -> dict:
    """A model's config.json, the text model's part for a multimodal checkpoint."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg.get("text_config", cfg)


SAME_MODEL_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def check_server(server: str, template: ChatTemplate, model_dir, served_model: str | None = None) -> dict:
    """The server answers for this target: {"model": served name, "max_model_len": n}. Compared
    where the API lets us: the served names, the served model's config.json when its root is a
    directory on this host, max_model_len against the target's positions, and the vocabulary (the
    tokenizer's largest id must be accepted)."""
    base = server.rstrip("/")
    try:
        cards = _call(base + "/v1/models").get("data", [])
    except ServerGoneError as e:
        raise ConfigError(f"--server {server}: no answer ({e.__cause__})",
                          "start the target's vLLM server (or give its URL) and run again") from e
    except urllib.error.HTTPError as e:
        raise ConfigError(f"--server {server}: /v1/models answered {e.code}",
                          "give the URL of an OpenAI-compatible (vLLM) server") from e
    if not isinstance(cards, list) or not all(isinstance(c, dict) and c.get("id") for c in cards):
        raise ConfigError(f"--server {server}: /v1/models lists no models with an id ({str(cards)[:80]})",
                          "give the URL of an OpenAI-compatible (vLLM) server")
    names = [c.get("id") for c in cards]
    if served_model:
        card = next((c for c in cards if c.get("id") == served_model), None)
        if card is None:
            raise ConfigError(f"--server {server} serves {names}, not --served-model {served_model}",
                              "give the served model's name, or the server of the target")
    elif len(cards) == 1:
        card = cards[0]
    else:
        raise ConfigError(f"--server {server} serves {len(cards)} models ({names})", "pass --served-model NAME")
    ours = _config(Path(model_dir))
    root = Path(card.get("root") or card["id"])
    theirs = _config(root) if root.is_dir() else {}
    differ = [k for k in SAME_MODEL_KEYS if k in ours and k in theirs and ours[k] != theirs[k]]
    if differ:
        raise ConfigError(f"--server {server} answers another model: its {root} has "
                          + ", ".join(f"{k} {theirs[k]}" for k in differ) + f", the target {model_dir} has "
                          + ", ".join(f"{k} {ours[k]}" for k in differ),
                          "point --server at the target's own server, or --model at the served model")
    max_len = card.get("max_model_len")
    positions = ours.get("max_position_embeddings")
    if max_len and positions and max_len > positions:
        raise ConfigError(f"--server {server} answers another model: max_model_len {max_len} is more than the "
                          f"target's max_position_embeddings {positions}", "point --server at the target's own server")
    if ours.get("vocab_size") and template.vocab_size > ours["vocab_size"]:
        raise ConfigError(f"--model {model_dir}: the tokenizer has {template.vocab_size} tokens, the model's "
                          f"vocab_size is {ours['vocab_size']}", "use the target's own tokenizer")
    top = template.vocab_size - 1
    try:
        _call(base + "/v1/completions", {"model": card["id"], "prompt": [top], "max_tokens": 1, "temperature": 0})
    except urllib.error.HTTPError as e:
        raise ConfigError(f"--server {server} answers another model: it refuses token id {top}, which the target's "
                          f"tokenizer has ({_http_detail(e)})", "point --server at the target's own server") from e
    except ServerGoneError as e:
        raise ConfigError(f"--server {server}: no answer to a completion ({e.__cause__})",
                          "check the server's log") from e
    return {"model": card["id"], "max_model_len": max_len}


# ---- prompts and the ledger ----------------------------------------------------------------------

def prompts_of(conversations, per_turn: bool):
    """(id, prompt messages) per prompt: up to the last user turn, or each user turn."""
    for conv in conversations:
        users = [i for i, m in enumerate(conv.messages) if m["role"] == "user"]
        for j in (users if per_turn else users[-1:]):
            yield (f"{conv.id}#{j}" if per_turn else conv.id), conv.messages[:j + 1]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_ledger(path: Path) -> set[str]:
    """Ids answered so far; a last line cut by a kill is cut off the file (its prompt is asked again)."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
            os.fsync(f.fileno())
    done = set()
    for n, line in enumerate(whole.splitlines()):
        try:
            done.add(json.loads(line)["id"])
        except (ValueError, KeyError) as e:
            raise ConfigError(f"{path} line {n + 1} is not a ledger record",
                              "restore the file, or remove the regenerate directory to start again") from e
    return done


class Ledger:
    def __init__(self, path: Path):
        self.path = path
        self.done = read_ledger(path)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict) -> None:
        os.write(self.fd, (json.dumps(record) + "\n").encode())  # one write: a kill cuts at most this line
        os.fsync(self.fd)
        self.done.add(record["id"])

    def close(self) -> None:
        os.close(self.fd)


def _settings(work: Path, settings: dict) -> None:
    path = work / SETTINGS
    if path.exists():
        old = json.loads(path.read_text())
        differ = [k for k in settings if k != "server" and old.get(k) != settings[k]]
        if differ:
            raise ConfigError(f"{work} was started with other settings ("
                              + ", ".join(f"{k} {old.get(k)!r} now {settings[k]!r}" for k in differ) + ")",
                              "rerun with the same flags and inputs to resume, or use another --out")
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(settings, indent=1) + "\n")
    os.replace(tmp, path)


# ---- the run -------------------------------------------------------------------------------------

def regenerate(inputs, template: ChatTemplate, server: str, out, sampling: Sampling, *, per_turn=False,
               concurrency=8, served_model=None, request_timeout=600.0, progress_s=10.0, log=print) -> Path:
    """Answer every prompt of `inputs` once (resuming from the ledger); returns the ledger's path."""
    from .data_build import refuse_existing

    if concurrency < 1:
        raise ConfigError(f"--concurrency {concurrency}", "give at least 1")
    refuse_existing(Path(out))  # a build there already: refused before a single request
    served = check_server(server, template, template.model_dir, served_model)
    prompts = list(prompts_of(read_conversations(inputs), per_turn))
    if not prompts:
        raise ConfigError("the input holds no user turn to answer", "give conversations with user turns")
    work = Path(out) / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    settings = {"server": server, "served_model": served["model"], "max_model_len": served["max_model_len"],
                "endpoint": "/v1/completions (prompt as token ids, return_token_ids)", **asdict(sampling),
                "stop_token_ids": template.stop_token_ids, "thinking": template.thinking, "per_turn": per_turn,
                "model": str(template.model_dir),
                "inputs": [{"path": str(p), "sha256": _sha256(Path(p))} for p in inputs]}
    _settings(work, settings)
    ledger = Ledger(work / LEDGER)
    todo = [(pid, msgs) for pid, msgs in prompts if pid not in ledger.done]
    log(f"regenerate: {len(prompts):,} prompt(s), {len(prompts) - len(todo):,} answered before, {len(todo):,} to ask "
        f"{served['model']} at {server} ({concurrency} at a time)")
    skipped: dict[str, str] = {}
    url = server.rstrip("/") + "/v1/completions"

    def ask(pid, msgs):
        try:
            ids = template.prompt_ids(msgs)
        except Exception as e:  # a template's own raise_exception (roles must alternate, ...)
            return pid, msgs, None, None, f"the chat template refused it ({str(e).splitlines()[0][:80]})"
        room = (served["max_model_len"] or 1 << 62) - len(ids)
        if room < 1:
            return pid, msgs, ids, None, f"prompt of {len(ids)} tokens fills max_model_len {served['max_model_len']}"
        body = {"model": served["model"], "prompt": ids, "max_tokens": min(sampling.max_tokens, room),
                "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                # Per prompt, not per position in the queue: the same answer whatever the order.
                "seed": sampling.seed + zlib.crc32(pid.encode()), "stop_token_ids": template.stop_token_ids,
                "return_token_ids": True, "skip_special_tokens": False}
        try:
            return pid, msgs, ids, _call(url, body, request_timeout)["choices"][0], None
        except urllib.error.HTTPError as e:
            if e.code >= 500:
                raise ServerGoneError(f"server {server} failed a request ({e.code}: {_http_detail(e)})") from e
            return pid, msgs, ids, None, f"refused ({e.code}: {_http_detail(e)})"

    t0 = last = time.monotonic()
    answered = tokens = 0
    pending, queue = set(), iter(todo)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        try:
            while True:
                while len(pending) < concurrency and (job := next(queue, None)) is not None:
                    pending.add(pool.submit(ask, *job))
                if not pending:
                    break
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    pid, msgs, ids, choice, why = f.result()
                    if choice is None:
                        skipped[pid] = why
                        continue
                    if choice.get("token_ids") is None:
                        raise ConfigError(f"--server {server} returns no token ids (return_token_ids)",
                                          "serve the target with vLLM 0.10.2 or newer")
                    completion = list(choice["token_ids"])
                    if choice.get("prompt_token_ids") not in (None, ids):
                        raise ServerGoneError(f"server {server} answered another prompt than the one sent for {pid}")
                    text = template.tok.decode(completion, skip_special_tokens=False)
                    text = text.removesuffix(template.end_of_turn)
                    ledger.append({"id": pid, "messages": msgs + [{"role": "assistant", "content": text}],
                                   "prompt_ids": ids, "completion_ids": completion,
                                   "finish_reason": choice.get("finish_reason")})
                    answered += 1
                    tokens += len(completion)
                now = time.monotonic()
                if now - last >= progress_s:
                    last = now
                    log(_progress(answered, len(todo), tokens, now - t0))
        except BaseException:
            for f in pending:
                f.cancel()
            raise
        finally:
            ledger.close()
    log(_progress(answered, len(todo), tokens, time.monotonic() - t0))
    for pid, why in list(skipped.items())[:5]:
        log(f"regenerate: not answered: {pid}: {why}")
    if skipped:
        log(f"regenerate: {len(skipped):,} prompt(s) not answered (above, first 5); a rerun asks them again")
    return ledger.path


def _progress(done: int, total: int, tokens: int, seconds: float) -> str:
    rate = done / seconds if seconds > 0 else 0.0
    eta = f", ETA {int((total - done) / rate)} s" if rate > 0 and done < total else ""
    return (f"regenerate: {done:,}/{total:,} answered ({100 * done / max(total, 1):.0f}%), {rate:.1f} prompts/s, "
            f"{tokens / seconds if seconds > 0 else 0:.0f} tokens/s{eta}")


def regenerated(ledger: Path):
    """The ledger's records as conversations for build (exact prompt and answer tokens)."""
    return read_conversations([ledger])

