"""Real acceptance length tau: speculative decoding of the target with the drafter.

One cycle (sampling.py has the loop and the acceptance rule): the anchor is the last committed
token (at first the target's own first token after the prompt); the drafter proposes B-1 tokens
from the target's features of every position before the anchor; the target scores [anchor,
drafts] in one pass; greedy accepts the longest prefix equal to the target's argmax plus one bonus
token, sampling (`--temperature`, `--top-p`) applies the speculative-sampling rule, so the output
is distributed as the target's own sampling. tau = committed tokens / cycles, bonus included, so
1 <= tau <= B. Offline "fixed ground truth" accuracies underestimate tau by ~1: this is the real one.

Two tau figures, named everywhere: `tau_pooled` (all committed tokens / all cycles; `tau` is the
same number, the key older readers use) and `tau_prompt_mean` (the mean over prompts of each
prompt's tau: the figure z-lab and SpecForge publish per benchmark set; it weighs a prompt with few
long cycles like one with many short ones, so it is usually a little higher). `accept_rate[k-1]`:
at block position k, accepted drafts / cycles that reached k (every earlier draft accepted).

KV caches (default; `--no-cache` runs the uncached oracle): the target keeps a transformers
DynamicCache of the committed positions; each cycle feeds only [anchor, drafts] and crops the
cache back to the committed length after acceptance. The drafter's context feature is shared by
all its layers and no layer updates it, so each layer's K/V of a context position depends on the
target's features alone: they are computed once per committed position (`DFlashDrafter.context_kv`)
and extended each cycle. So a cycle runs the target and the drafter on B positions whatever the
context length (attention still reads the cached keys, as in any cached decoder).

Hybrid targets (Qwen3.5/3.6, Qwen3-Next: Gated-DeltaNet linear attention beside full attention)
run cached too, though a linear layer's recurrent and short-convolution state cannot be cropped:
`hybrid_cache.LinearStates` copies those states before the verify pass (the state at the
committed position), records each linear layer's mixer input during it, and after acceptance puts
the copy back and re-runs only the linear layers' mixers over the committed tokens' recorded
inputs (nothing when the whole block is accepted); the full-attention layers' keys and values are
cropped as above. So a rejected draft never reaches the kept state, and a cycle costs one target
pass over B positions plus the linear mixers over the accepted ones. A hybrid whose layers are not
laid out as transformers' Qwen3.5 ones (`hybrid_cache.supports`) runs uncached.

The uncached path (`--no-cache`, the oracle) re-runs the whole sequence each cycle; tests hold the
cached one to its drafts, outputs, acceptance counts and cycle counts exactly, on the tiny Qwen3
and the tiny hybrid target, greedy and sampled.

Prompt sets (`load_prompt_sets`): JSONL, one prompt per line, `{"set": NAME, "input_ids": [...]}`
or `{"set": NAME, "messages": [{"role": ..., "content": ...}, ...]}` (rendered with the target's
tokenizer and chat template, generation prompt added); without "set" the file's stem names the
set. `dflash-eval --prompts A.jsonl B.jsonl` reports tau per set and over all of them.

`dflash-eval --drafter DIR` measures a DFlash directory (dflash-export's output, or a published
drafter of the same format) the same way.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from flashfleet.contract import layout
from flashfleet.plan.settings import RunConfig

from . import hybrid_cache
from .attention import block_attention_inputs, layer_windows
from .chat_template import reads_thinking, thinking_kwargs
from .data import Blocks
from .defaults import BLOCK_SIZE, RANDOM_DRAFTER_LAYERS
from .drafter import DFlashDrafter, DrafterConfig, default_mask_token_id, drafter_hidden
from .loss import IGNORE
from .sampling import GREEDY, Sampling, Stats, decode, propose, walk
from .target import default_target_layers, text_config_of


class PromptError(ValueError):
    """A prompt file that cannot be read as prompt sets: what (naming the file and line) and the fix."""

    def __init__(self, what: str, fix: str = "one JSON object per line, {\"set\": NAME, \"input_ids\": [...]} or "
                 "{\"set\": NAME, \"messages\": [...]}"):
        super().__init__(f"{what} (fix: {fix})")
        self.what, self.fix = what, fix


def _prompt_ids(rec, where, tokenizer_fn, thinking="on"):
    if isinstance(rec, dict) and "input_ids" in rec:
        ids = rec["input_ids"]
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and t >= 0 for t in ids)):
            raise PromptError(f"{where}: input_ids must be a non-empty list of token ids (integers >= 0)")
        return ids
    if isinstance(rec, dict) and "messages" in rec:
        msgs = rec["messages"]
        if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "role" in m and "content" in m
                                                        for m in msgs)):
            raise PromptError(f"{where}: messages must be a non-empty list of {{\"role\", \"content\"}} objects")
        tok = tokenizer_fn()
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                      **thinking_kwargs(thinking == "on"))
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return [int(t) for t in ids]
    raise PromptError(f"{where}: a prompt line needs \"input_ids\" or \"messages\"")


def load_prompt_sets(paths, limit=None, tokenizer=None, thinking="on", info=None) -> dict:
    """{set name: [token id lists]} from JSONL files (format above), at most `limit` prompts per
    set, sets in order of first appearance. tokenizer: an object with apply_chat_template, or a
    function returning one (called only when a line has messages). thinking: the chat template's
    switch, "on" or "off" (chat_template.THINKING_SWITCH). With a dict `info`, info["thinking"]
    says what the prompts were rendered with: the switch when a kept prompt went through a
    template that reads it, else None (token ids only, or a template without the switch).
    Raises PromptError."""
    cache = {}

    def tokenizer_fn():
        if "tok" not in cache:
            t = tokenizer() if callable(tokenizer) and not hasattr(tokenizer, "apply_chat_template") else tokenizer
            if t is None or getattr(t, "chat_template", "") is None:
                raise PromptError("a prompt has messages but the target has no tokenizer with a chat template",
                                  "give input_ids, or a target directory with its tokenizer")
            cache["tok"] = t
        return cache["tok"]

    sets = {}
    for path in [paths] if isinstance(paths, str | Path) else paths:
        path = Path(path)
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise PromptError(f"prompt file {path}: {e.strerror or e}", "give an existing JSONL file") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}"
            try:
                rec = json.loads(line)
            except ValueError:
                raise PromptError(f"{where}: not JSON") from None
            if not isinstance(rec, dict):
                raise PromptError(f"{where}: not a JSON object")
            name = rec.get("set", path.stem)
            if not isinstance(name, str) or not name:
                raise PromptError(f"{where}: \"set\" must be a non-empty string")
            got = sets.setdefault(name, [])
            if limit is None or len(got) < limit:
                got.append(_prompt_ids(rec, where, tokenizer_fn, thinking))
    if not sets:
        raise PromptError(f"no prompts in {', '.join(map(str, [paths] if isinstance(paths, str | Path) else paths))}")
    if info is not None:
        info["thinking"] = thinking if "tok" in cache and reads_thinking(cache["tok"]) else None
    return sets


def run_prompts_path(eval_prompts, data_dir) -> Path:
    """A run's held-out prompts: its --eval-prompts, else <data-dir>/eval/prompts.jsonl."""
    return Path(eval_prompts) if eval_prompts else Path(data_dir) / layout.EVAL_PROMPTS


def load_prompts(path, limit=None) -> list[list[int]]:
    """The first `limit` prompts of one file (its sets in order), token ids only."""
    out = []
    for prompts in load_prompt_sets(path).values():
        out += prompts
    return out if limit is None else out[:limit]


@torch.no_grad()
def draft_block_hidden(drafter, embed_weight, feats, anchor_token, anchor, block_size, mask_token_id):
    """The drafter's output [B-1, H] at positions anchor+1 .. anchor+B-1, from the target's
    features `feats` [1, >= anchor, n*H] (the uncached path: the whole context every time)."""
    ids = torch.full((1, block_size), mask_token_id, dtype=torch.long)
    ids[0, 0] = anchor_token
    blocks = Blocks(seq=torch.zeros(1, dtype=torch.long), anchor=torch.tensor([anchor]), input_ids=ids,
                    labels=torch.full_like(ids, IGNORE), teacher_pos=torch.zeros_like(ids))
    return drafter_hidden(drafter, embed_weight, feats, blocks)[0, 1:]


class UncachedSession:
    """The oracle: every target pass re-runs the whole sequence, every draft re-reads the whole
    context."""

    def __init__(self, producer, drafter, mask_id):
        self.producer, self.drafter, self.mask_id = producer, drafter, mask_id
        self.block_size = drafter.config.block_size
        self.seq, self.feats, self.pending = [], None, []

    def _logits(self, last):
        return last @ self.producer.lm_head_weight.t()

    def start(self, prompt):
        self.seq = list(prompt)
        self.feats, last = self.producer.forward(torch.tensor([self.seq]))
        return self._logits(last[0, -1])

    def draft_hidden(self, anchor_token):
        return draft_block_hidden(self.drafter, self.producer.embed_weight, self.feats, anchor_token, len(self.seq),
                                  self.block_size, self.mask_id)

    def draft(self, anchor_token):
        """The drafter's logits [B-1, V] for this block."""
        hidden = self.draft_hidden(anchor_token)
        return hidden @ self.producer.lm_head_weight.t().to(hidden.dtype)

    def propose(self, anchor_token, s: Sampling, gen):
        """This cycle's drafts and their q (sampling.propose; sampling.walk for a DFlash 2 drafter,
        whose `selector` reranks each position's candidates as the engines do)."""
        hidden = self.draft_hidden(anchor_token)
        logits = hidden @ self.producer.lm_head_weight.t().to(hidden.dtype)
        selector = getattr(self.drafter, "selector", None)
        if selector is None:
            return propose(logits, s, gen)
        return walk(selector, hidden, logits, anchor_token, s, gen)

    def verify(self, anchor_token, drafts):
        anchor, self.pending = len(self.seq), [anchor_token, *drafts]
        self.feats, last = self.producer.forward(torch.tensor([self.seq + self.pending]))
        return self._logits(last[0, anchor:anchor + self.block_size])

    def commit(self, n):
        self.seq += self.pending[:n]


class CachedSession(UncachedSession):
    """The target's DynamicCache and the drafter's per-layer context K/V hold the committed
    positions; each pass runs on the B new positions only."""

    def __init__(self, producer, drafter, mask_id):
        super().__init__(producer, drafter, mask_id)
        self.dev = producer.embed_weight.device
        self.windows = layer_windows(drafter.config)
        self.cache = self.ctx_kv = self.linear = None
        self.n = 0  # committed positions in both caches (= the next anchor's position)

    @staticmethod
    def supported(producer) -> bool:
        """Whether the target's cache can be put back at the committed position after a rejection:
        cropped (attention only), or a hybrid whose linear-attention state `hybrid_cache` keeps."""
        from transformers import DynamicCache

        if hybrid_cache.linear_layer_ids(producer.config):
            return hybrid_cache.supports(producer.config, producer.replicas[0][1].get_decoder())
        return bool(getattr(DynamicCache(config=producer.config), "is_croppable", True))

    def _extend_context(self, feats, start):
        pos = torch.arange(start, start + feats.shape[0], device=self.dev)
        new = self.drafter.context_kv(feats, pos)
        self.ctx_kv = new if self.ctx_kv is None else [
            (torch.cat([k0, k1], dim=1), torch.cat([v0, v1], dim=1)) for (k0, v0), (k1, v1) in zip(self.ctx_kv, new,
                                                                                                    strict=True)]

    def start(self, prompt):
        from transformers import DynamicCache

        self.cache, self.ctx_kv, self.n = DynamicCache(config=self.producer.config), None, len(prompt)
        self.linear = (hybrid_cache.LinearStates(self.producer.replicas[0][1].get_decoder(), self.producer.config,
                                                 self.cache)
                       if hybrid_cache.linear_layer_ids(self.producer.config) else None)
        feats, last = self.producer.forward(torch.tensor([list(prompt)]), replica=0, past_key_values=self.cache)
        self._extend_context(feats[0], 0)
        return self._logits(last[0, -1])

    @torch.no_grad()
    def draft_hidden(self, anchor_token):
        b = self.block_size
        ids = torch.full((b,), self.mask_id, dtype=torch.long, device=self.dev)
        ids[0] = anchor_token
        anchor = torch.tensor([self.n], device=self.dev)
        zero = torch.zeros(1, dtype=torch.long, device=self.dev)
        # the uncached path's mask for this block: context 0..n-1 (all cached), the block itself
        masks = {t: block_attention_inputs(zero, anchor, b, **w)[3] for t, w in self.windows.items()}
        block_pos = torch.arange(self.n, self.n + b, device=self.dev)
        hidden = self.drafter(F.embedding(ids, self.producer.embed_weight), None, None, block_pos, masks,
                              ctx_kv=self.ctx_kv)
        return hidden[1:]

    def verify(self, anchor_token, drafts):
        ids = torch.tensor([[anchor_token, *drafts]])
        if self.linear is None:
            self.feats, last = self.producer.forward(ids, replica=0, past_key_values=self.cache)
        else:  # the linear layers' state at the committed position, and their inputs over the block
            self.linear.snapshot()
            with self.linear.capture():
                self.feats, last = self.producer.forward(ids, replica=0, past_key_values=self.cache)
        return self._logits(last[0])

    def commit(self, n):
        rejected = self.cache.get_seq_length() - (self.n + n)
        if self.linear is None:
            if rejected > 0:  # a negative crop removes that many (transformers 5.x; crop(0) is not a no-op everywhere)
                self.cache.crop(-rejected)
        else:
            hybrid_cache.crop_attention(self.cache, rejected)
            self.linear.advance(n)
        self._extend_context(self.feats[0, :n], self.n)
        self.n += n


def _summary(stats: Stats, per_prompt: list, block_size: int, s: Sampling, thinking) -> dict:
    return {"tau": stats.tau, "tau_pooled": stats.tau,
            "tau_prompt_mean": sum(per_prompt) / len(per_prompt) if per_prompt else None,
            "prompts": len(per_prompt), "cycles": stats.cycles, "tokens": stats.tokens, "block_size": block_size,
            "accept_rate": stats.accept_rate(), **s.record(), "thinking": thinking}


@torch.no_grad()
def speculative_tau(producer, drafter, prompts, block_size, max_new_tokens=64, mask_token_id=None, trace=None,
                    cache=True, sampling=GREEDY, seed=0, thinking=None):
    """tau over prompts: `tau_pooled` (= `tau`), `tau_prompt_mean`, `accept_rate`, counts, the
    settings it was measured with (`temperature`, `top_p`, `top_k`, and `thinking`: what
    load_prompt_sets' info says the prompts were rendered with), and `per_prompt` (each prompt's
    tau). prompts: a list of token id lists, or {set name: such a
    list}, which adds `sets` {name: the same figures for that set}. cache=False runs the
    uncached oracle (also the path for a target `CachedSession.supported` refuses). Sampling
    draws from one generator seeded with `seed`. With a list `trace`, one dict per prompt is
    appended: `drafts` (each cycle's B-1 proposals), `committed` (tokens per cycle, bonus
    included) and `output` (the generated tokens, the target's first token included)."""
    was_training = drafter.training
    drafter.eval()
    mask_id = drafter.config.mask_token_id if mask_token_id is None else mask_token_id
    cached = cache and CachedSession.supported(producer)
    session = (CachedSession if cached else UncachedSession)(producer, drafter, mask_id)
    dev = producer.embed_weight.device
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    sets = prompts if isinstance(prompts, dict) else {None: prompts}
    total, per_prompt, by_set = Stats(block_size), [], {}
    try:
        for name, group in sets.items():
            st, taus = Stats(block_size), []
            for prompt in group:
                record = {} if trace is not None else None
                one = decode(session, prompt, max_new_tokens, block_size, sampling, gen, record)
                if trace is not None:
                    trace.append(record)
                st.add(one)
                taus.append(one.tau)
            total.add(st)
            per_prompt += taus
            by_set[name] = _summary(st, taus, block_size, sampling, thinking)
    finally:
        drafter.train(was_training)
    res = {**_summary(total, per_prompt, block_size, sampling, thinking), "cached": cached, "per_prompt": per_prompt}
    if isinstance(prompts, dict):
        res["sets"] = by_set
    return res


# ---- evaluation, wherever the replica is -----------------------------------------------------

def eval_wanted(cfg: RunConfig, n) -> bool:
    """Whether an evaluation of n prompts per set has prompts to run."""
    return n > 0 and Path(run_prompts_path(cfg.eval.eval_prompts, cfg.paths.data_dir)).is_file()


def eval_sampling(s) -> Sampling:
    """The sampling settings of the run's eval section (RunConfig.eval), or of dflash-eval's flags."""
    return Sampling(s.eval_temperature, s.eval_top_p, s.eval_top_k, s.eval_draft_sample_method)


def evaluate_drafter(cfg: RunConfig, producer, drafter, n, kind) -> dict:
    """tau of `drafter` against the replica `producer` on the first n held-out prompts of each set:
    evaluate.speculative_tau's figures (without per_prompt), `eval` = kind and `eval_s`. Run by a
    drafter rank (trainer.Trainer.evaluate), or by a target worker for one (worker_eval)."""
    t0 = time.perf_counter()
    info = {}
    sets = load_prompt_sets(run_prompts_path(cfg.eval.eval_prompts, cfg.paths.data_dir), n,
                            _tokenizer_of(cfg.paths.target_model), cfg.eval.eval_thinking, info)
    res = speculative_tau(producer, drafter, sets if len(sets) > 1 else next(iter(sets.values())),
                          cfg.drafter.block_size, cfg.eval.eval_max_new_tokens, sampling=eval_sampling(cfg.eval),
                          seed=cfg.optimisation.seed, thinking=info["thinking"])
    res.pop("per_prompt")
    return {**res, "eval": kind, "eval_s": time.perf_counter() - t0}


def worker_eval(cfg: RunConfig, producer, device, request) -> dict:
    """A target worker's side of feed.EvalRequest: the drafter rebuilt on the worker's device from
    the request's config and weights (copied off the sender's memory at once), evaluated on this
    worker's replica with the interval evaluation's prompts."""
    drafter = DFlashDrafter(DrafterConfig.from_dict(request.config)).to(device)
    drafter.load_state_dict(request.weights)
    res = evaluate_drafter(cfg, producer, drafter, cfg.eval.eval_interval_prompts, "interval")
    del drafter
    return res


def load_exported_drafter(path, target_model, device="cpu") -> DFlashDrafter:
    """A drafter from a DFlash directory (dflash-export's, or a published one), checked against the
    target it will run with. Raises ConfigError."""
    from .export import check_target, load_dflash_dir, target_facts

    cfg, state = load_dflash_dir(path)
    check_target(cfg, target_facts(target_model), f"drafter {path}")
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(state)
    return drafter.to(device).eval()


def _tokenizer_of(target_model):
    def load():
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(target_model, local_files_only=True)
        except (OSError, ValueError):
            return None

    return load


def main(argv=None):
    from flashfleet.contract.messages import EX_CONFIG

    from .checkpoint import complete_checkpoints
    from .config import add_setting, check_bounds
    from .drafter import load_drafter
    from .errors import CliParser, ConfigError
    from .target import HiddenStateProducer

    p = CliParser(prog="dflash-eval", description="Measure the real acceptance length tau of a "
                                "drafter by speculative decoding with the target (CPU or one GPU), greedy or sampled, "
                                "per prompt set. Prints one JSON line: tau_pooled (= tau: all committed tokens / all "
                                "cycles), tau_prompt_mean (the mean of per-prompt tau, the published figure), "
                                "accept_rate per block position, and the same per set under \"sets\".")
    p.add_argument("--run-config", default=None, metavar="RUN.json", help="a run's rendered configuration (what "
                   "dflash-train --config reads): its target model and held-out prompts, where --target-model "
                   "and --prompts are not given")
    add_setting(p, "target_model")
    p.add_argument("--checkpoint", default=None, help="checkpoint dir (default: newest complete in --output-dir)")
    add_setting(p, "output_dir", use="here its newest complete checkpoint is evaluated")
    p.add_argument("--drafter", default=None, metavar="DIR", help="a DFlash drafter directory (dflash-export's "
                   "OUT_DIR, or a published one: config.json + model.safetensors) instead of a checkpoint")
    p.add_argument("--random-drafter", action="store_true", help="evaluate an untrained drafter (the baseline)")
    add_setting(p, "block_size", default=BLOCK_SIZE["dflash"], use="with --random-drafter (a DFlash drafter: "
                f"{BLOCK_SIZE['dflash']} unless given)")
    add_setting(p, "num_draft_layers", default=RANDOM_DRAFTER_LAYERS, use="with --random-drafter")
    add_setting(p, "seed", use="here the random drafter's init and the sampling generator")
    p.add_argument("--prompts", default=None, nargs="+", metavar="JSONL", help="prompt set files: one JSON object "
                   "per line, {\"set\": NAME, \"input_ids\": [...]} or {\"set\": NAME, \"messages\": [...]} "
                   "(chat messages, rendered with the target's chat template); no \"set\": the file's stem")
    p.add_argument("--num-prompts", type=int, default=32, help="prompts per set (the first N)")
    add_setting(p, "eval_max_new_tokens", "--max-new-tokens")
    add_setting(p, "eval_temperature", "--temperature")
    add_setting(p, "eval_top_p", "--top-p")
    add_setting(p, "eval_top_k", "--top-k")
    add_setting(p, "eval_draft_sample_method", "--draft-sample-method")
    add_setting(p, "eval_thinking", "--thinking")
    p.add_argument("--no-cache", action="store_true", help="re-run the whole sequence every cycle (the oracle the "
                   "cached evaluator is tested against; slower)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts-out", default=None, metavar="FILE", help="also write the prompts evaluated, a JSON "
                   "list of token id lists in set order (what vllm_serve_check asks vLLM)")
    try:
        a = p.parse_args(argv)
        if a.run_config:
            run = json.loads(Path(a.run_config).read_text())
            if not isinstance(run, dict):
                raise ValueError(f"--run-config {a.run_config} is not a JSON object")
            a.target_model = a.target_model or run.get("target_model")
            a.prompts = a.prompts or [str(run_prompts_path(run.get("eval_prompts"), run.get("data_dir", ".")))]
        if not a.target_model or not a.prompts:
            raise ValueError("--target-model and --prompts are needed (or --run-config RUN.json that names them)")
        check_bounds(a)  # the shared settings' ranges, as dflash-train checks them
        sampling = eval_sampling(a)
        if a.num_prompts < 1:
            raise ValueError(f"--num-prompts {a.num_prompts} must be >= 1")
        info = {}
        sets = load_prompt_sets(a.prompts, a.num_prompts, _tokenizer_of(a.target_model), a.eval_thinking, info)
        torch.device(a.device)  # a malformed --device: refused now, not after the target loaded
        if a.prompts_out:  # written at the end: a path that cannot take it is refused before the work
            out = Path(a.prompts_out)
            if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
                raise ValueError(f"--prompts-out {out}: not a writable file path (a directory, or no such directory)")
    except ConfigError as e:
        print(e.line(), file=sys.stderr)
        return EX_CONFIG
    except PromptError as e:
        print(ConfigError(e.what, e.fix).line(), file=sys.stderr)
        return EX_CONFIG
    except (ValueError, OSError, RuntimeError) as e:  # RuntimeError: torch.device's refusal
        print(ConfigError(str(e).splitlines()[0] if str(e) else type(e).__name__,
                          "give values in range and files that exist (dflash-eval --help)").line(),
              file=sys.stderr)
        return EX_CONFIG
    if a.random_drafter:
        from transformers import AutoConfig

        tcfg = AutoConfig.from_pretrained(a.target_model, local_files_only=True)
        text = text_config_of(tcfg)  # the language model's config (Qwen3.5/3.6 nest it)
        torch.manual_seed(a.seed)
        try:
            layer_ids = default_target_layers(text.num_hidden_layers, a.num_draft_layers)
        except ValueError as e:
            print(ConfigError(f"--num-draft-layers {a.num_draft_layers}: {e}", "fewer --num-draft-layers").line(),
                  file=sys.stderr)
            return EX_CONFIG
        cfg = DrafterConfig.from_target(tcfg, num_draft_layers=a.num_draft_layers, block_size=a.block_size,
                                        target_layer_ids=layer_ids, mask_token_id=default_mask_token_id(text.vocab_size))
        drafter = DFlashDrafter(cfg).to(a.device)
    elif a.drafter:
        try:
            drafter = load_exported_drafter(a.drafter, a.target_model, a.device)
        except ConfigError as e:
            print(e.line(), file=sys.stderr)
            return EX_CONFIG
    else:
        ckpt = a.checkpoint
        if ckpt is None:
            found = complete_checkpoints(Path(a.output_dir or ".") / layout.CHECKPOINTS)
            if not found:
                print(ConfigError(f"no complete checkpoint under --output-dir {a.output_dir or '.'}",
                                  "pass --output-dir of a run that saved one, --checkpoint, or --drafter").line(),
                      file=sys.stderr)
                return EX_CONFIG
            ckpt = found[-1]
        elif not Path(ckpt).is_dir():
            print(ConfigError(f"--checkpoint {ckpt}: not a directory", "pass checkpoints/step-XXXXXXXX of a run").line(),
                  file=sys.stderr)
            return EX_CONFIG
        drafter = load_drafter(ckpt, a.device)
    producer = HiddenStateProducer(a.target_model, [a.device], drafter.config.target_layer_ids, a.device)
    res = speculative_tau(producer, drafter, sets, drafter.config.block_size, a.eval_max_new_tokens,
                          cache=not a.no_cache, sampling=sampling, seed=a.seed, thinking=info["thinking"])
    res.pop("per_prompt")
    if a.prompts_out:
        Path(a.prompts_out).write_text(json.dumps([p for prompts in sets.values() for p in prompts]) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
