"""The DFlash drafter directory format, both ways: what vLLM, SGLang and z-lab's `dflash` load.

    OUT_DIR/config.json         Qwen3Config fields + architectures ["DFlashDraftModel"], top-level
                                block_size, dflash_config {mask_token_id, target_layer_ids},
                                num_target_layers (CONFIG_* below say which keys mean what);
                                a DFlash 2 drafter: ["DFlash2DraftModel"], and dflash_config also
                                {conv_kernel_size, conv_group_size, selector_rank, selector_top_k}
    OUT_DIR/model.safetensors   bf16, unprefixed names (NAME MAP below), no embed_tokens / lm_head:
                                the serving engine uses the target's
    OUT_DIR/README.md           model card: target, training, tau, serving command lines

`dflash-export CHECKPOINT_OR_RUN_DIR OUT_DIR [--force] [--target-model DIR]` writes it from a
checkpoint (default: the newest complete one of a run directory); `load_dflash_dir` reads one back
(ours or a published one) for `dflash-eval --drafter` and `dflash-train --init-from`, and
`check_init_from` is what preflight refuses an incompatible --init-from with. This module is the
one place that knows the format's names and keys (docs/export.md).

Semantics (checked against z-lab's `DFlashDraftModel`, tests/unit/test_export.py): the same
drafter as drafter.py, i.e. features are the outputs of decoder layers `target_layer_ids` (HF
hidden_states[i+1]); context K/V from hidden_norm(fc(features)) without input_layernorm, k_norm,
RoPE at absolute positions; the block is [anchor, mask x (B-1)] at positions anchor..anchor+B-1,
slot k >= 1 predicts the token at anchor+k; every layer is full (non-causal) attention.
DFlash 2 (checked against z-lab's `DFlash2DraftModel` and speculators 0.9.0, tests/unit/
test_dflash2_oracle.py): the same, with the convolutions and the selector of dflash2.py, whose
names and shapes are vLLM 0.32.0's (model_executor/models/qwen3_dflash2.py). vLLM takes the
convolution's block position as row % (num_speculative_tokens + 1): a DFlash 2 drafter must be
served with num_speculative_tokens = block_size - 1 (`check_served_block`).
"""

import ctypes
import errno
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from flashfleet.contract import checkpoint as contract
from flashfleet.contract import layout
from flashfleet.contract import metrics as metrics_contract
from flashfleet.contract import safetensors as st_contract
from flashfleet.contract.files import fsync_dir, fsync_file
from flashfleet.contract.messages import EX_CONFIG

from .dflash2 import SHAPE as DFLASH2_SHAPE
from .dflash2 import dflash2_problem
from .drafter import DrafterConfig
from .errors import CliParser, ConfigError
from .target import default_target_layers, layer_ids_problem

WEIGHTS, CONFIG, README = "model.safetensors", "config.json", "README.md"
ARCHITECTURE = "DFlashDraftModel"
# The architecture name of each drafter kind (vLLM's registry and z-lab's class names).
ARCHITECTURES = {"dflash": ARCHITECTURE, "dflash2": "DFlash2DraftModel"}
KIND_OF_ARCHITECTURE = {a: k for k, a in ARCHITECTURES.items()}
KIND_NAMES = {"dflash": "DFlash", "dflash2": "DFlash 2"}
MODEL_TYPE = "qwen3"
FULL, SLIDING = "full_attention", "sliding_attention"
DTYPE = "bfloat16"
PROVENANCE = "flashfleet"  # our own key in config.json (loaders keep unknown keys as attributes, unused)
# Keys a drafter config must have (top level, Qwen3Config's names).
REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "num_hidden_layers", "vocab_size")
# Keys that change the forward pass in some loader and that this trainer's drafter does not have:
# refused unless they hold their neutral value (a DFlash 2 drafter's conv_kernel_size and
# selector_rank are its own settings instead).
NEUTRAL = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "logit_scale": 1.0,
           "final_logit_softcapping": None, "attention_sink_bias": None, "attention_value_scale": None,
           "projector_type": None, "conv_kernel_size": None, "selector_rank": None}
MLP = ("gate_proj", "up_proj", "down_proj")


# ---- the name map and the shapes ------------------------------------------------------------------

def layer_types_of(cfg) -> list[str]:
    """The drafter's attention kind per layer (all full when the config predates layer_types)."""
    return list(getattr(cfg, "layer_types", None) or [FULL] * cfg.num_hidden_layers)


SELECTOR_OURS, SELECTOR_THEIRS = "selector.", "candidate_selector."  # DFlash 2's selector


def format_name(ours: str) -> str:
    """Our state-dict name -> the format's: the MLP lives under `mlp.` there (layers.N.mlp.gate_proj),
    DFlash 2's selector is `candidate_selector.` (its codebooks without `.weight`: vLLM's names;
    z-lab maps them to its nn.Embedding's)."""
    if ours.startswith(SELECTOR_OURS):
        return SELECTOR_THEIRS + ours[len(SELECTOR_OURS):]
    parts = ours.split(".")
    if len(parts) == 4 and parts[0] == "layers" and parts[2] in MLP:
        return f"layers.{parts[1]}.mlp.{parts[2]}.{parts[3]}"
    return ours


def our_name(theirs: str) -> str:
    """The format's name -> ours (inverse of format_name)."""
    if theirs.startswith(SELECTOR_THEIRS):
        return SELECTOR_OURS + theirs[len(SELECTOR_THEIRS):]
    parts = theirs.split(".")
    if len(parts) == 5 and parts[0] == "layers" and parts[2] == "mlp" and parts[3] in MLP:
        return f"layers.{parts[1]}.{parts[3]}.{parts[4]}"
    return theirs


def tensor_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """{format name: shape} of every tensor a drafter with this config has (and nothing else)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv, k = cfg.num_attention_heads, cfg.num_key_value_heads, len(cfg.target_layer_ids)
    shapes = {"fc.weight": (h, k * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nh * d, h), p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h), p + "self_attn.o_proj.weight": (h, nh * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        })
        if kind_of(cfg) == "dflash2":
            taps, groups = cfg.conv_kernel_size, h // cfg.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                shapes.update({f"{p}{conv}.base_kernel": (2, taps, h),
                               f"{p}{conv}.kernel_projection.weight": (2 * taps * groups, h)})
    if kind_of(cfg) == "dflash2":
        v, r = cfg.vocab_size, cfg.selector_rank
        shapes.update({SELECTOR_THEIRS + "predecessor_codebook": (v, r), SELECTOR_THEIRS + "successor_codebook": (v, r),
                       SELECTOR_THEIRS + "hidden_projection.weight": (r, h)})
    return shapes


def kind_of(cfg) -> str:
    """The drafter's kind (a config from before drafter_kind: dflash)."""
    return getattr(cfg, "drafter_kind", None) or "dflash"


def shape_problems(cfg, have: dict, where: str) -> list[str]:
    """Missing, unknown and mis-shaped tensors of `have` ({format name: shape}) against cfg."""
    want = tensor_shapes(cfg)
    problems = [f"{where}: {name} has shape {list(have[name])}, expected {list(shape)}"
                for name, shape in want.items() if name in have and tuple(have[name]) != shape]
    missing = [n for n in want if n not in have]
    unknown = sorted(n for n in have if n not in want)
    if missing:
        problems.append(f"{where}: missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
                        f"({len(missing)} tensor(s))")
    if unknown:
        own = [n for n in unknown if "embed_tokens" in n or "lm_head" in n]
        problems.append(f"{where}: unknown tensor(s) {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''}"
                        + (" (a DFlash drafter has no embedding or LM head of its own: it uses the target's)"
                           if own else ""))
    return problems


# ---- the target ----------------------------------------------------------------------------------

def target_facts(target_dir) -> dict:
    """What the format needs from the target, read from its config.json (through `text_config`
    for composite configs such as Qwen3.5's). Raises ConfigError if it is unreadable."""
    path = Path(target_dir) / "config.json"
    fix = "pass --target-model DIR: the target's local directory (the one the drafter was trained on)"
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the target's config {path} ({getattr(e, 'strerror', None) or e})", fix) from e
    text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    facts = {k: text.get(k) for k in ("num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings")}
    if facts["vocab_size"] is None:
        facts["vocab_size"] = raw.get("vocab_size")
    missing = [k for k, v in facts.items() if not isinstance(v, int)]
    if missing:
        raise ConfigError(f"the target's config {path} has no {', '.join(missing)}", fix)
    facts.update(model_type=raw.get("model_type") or text.get("model_type") or "unknown",
                 name=raw.get("_name_or_path") or Path(target_dir).resolve().name, path=str(target_dir))
    return facts


def check_target(cfg, facts: dict, what: str = "the drafter") -> None:
    """Refuse a target the drafter cannot run on (vocab, hidden size, feature layers, mask id)."""
    fix = "pass --target-model DIR of the target the drafter was trained on"
    t = facts.get("path", "the target")
    if facts["vocab_size"] != cfg.vocab_size:
        raise ConfigError(f"vocabulary mismatch: target {t} has vocab_size {facts['vocab_size']} but {what} was "
                          f"trained for {cfg.vocab_size}", fix)
    if facts["hidden_size"] != cfg.hidden_size:
        raise ConfigError(f"hidden size mismatch: target {t} has hidden_size {facts['hidden_size']} but {what} "
                          f"has {cfg.hidden_size} (a drafter of another target)", fix)
    n = facts["num_hidden_layers"]
    if max(cfg.target_layer_ids) >= n or min(cfg.target_layer_ids) < 0:
        raise ConfigError(f"target_layer_ids {cfg.target_layer_ids} of {what} are outside target {t}'s {n} "
                          "decoder layers (a drafter of another target)", fix)
    if not 0 <= cfg.mask_token_id < facts["vocab_size"]:
        raise ConfigError(f"mask_token_id {cfg.mask_token_id} of {what} is not a row of target {t}'s "
                          f"{facts['vocab_size']}-row vocabulary", fix)


# ---- ours -> the format ----------------------------------------------------------------------------

def to_dflash(cfg, state_dict: dict, target: dict, provenance: dict | None = None) -> tuple[dict, dict]:
    """(config.json dict, {format name: bf16 tensor}) of a drafter: cfg (DrafterConfig), its state
    dict in our names, the target's facts (target_facts). Raises ConfigError on a drafter whose
    tensors do not match its config or whose target does not match."""
    import torch

    check_target(cfg, target)
    tensors = {format_name(k): v for k, v in state_dict.items()}
    problems = shape_problems(cfg, {k: tuple(v.shape) for k, v in tensors.items()}, "the checkpoint's weights")
    if problems:
        raise ConfigError("; ".join(problems), "export a complete checkpoint of this drafter (its config.json "
                          "and drafter.safetensors must agree)")
    types = layer_types_of(cfg)
    window = getattr(cfg, "sliding_window", None)
    sliding = SLIDING in types
    if sliding and not window:
        raise ConfigError(f"layer_types {types} has sliding layers but no sliding_window", "set sliding_window")
    kind = kind_of(cfg)
    config = {
        "architectures": [ARCHITECTURES[kind]], "model_type": MODEL_TYPE, "dtype": DTYPE,
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                          **({k: getattr(cfg, k) for k in DFLASH2_SHAPE} if kind == "dflash2" else {})},
        "num_target_layers": target["num_hidden_layers"],
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_hidden_layers, "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "rope_theta": float(cfg.rope_theta), "rope_scaling": None,
        "max_position_embeddings": target["max_position_embeddings"], "vocab_size": target["vocab_size"],
        "tie_word_embeddings": False, "layer_types": types,
        "sliding_window": int(window) if sliding else None, "use_sliding_window": sliding,
        # DFlash 2's sliding layers see their block both ways: z-lab's and vLLM's loaders read that from
        # is_causal (absent, their sliding layers are causal, as DFlash's are)
        **({"is_causal": False} if sliding and getattr(cfg, "sliding_window_non_causal", False) else {}),
        "max_window_layers": cfg.num_hidden_layers, "initializer_range": 0.02, "use_cache": True,
        PROVENANCE: {"target": target["name"], "target_model_type": target["model_type"],
                     "feature_convention": cfg.feature_convention, **(provenance or {})},
    }
    out = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sorted(tensors.items())}
    return config, out


# ---- the format -> ours ------------------------------------------------------------------------------

def _value(raw: dict, name: str, default=None):
    """A DFlash key: dflash_config first, then the top level (how every loader resolves them)."""
    dc = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    return dc[name] if name in dc else raw.get(name, default)


def config_from_dflash(raw: dict, where: str = "config.json") -> DrafterConfig:
    """A DrafterConfig from a DFlash config.json dict. Raises ConfigError on a missing key or on a
    drafter this trainer cannot represent (biases, non-SiLU, logit scaling, sliding layers before
    DrafterConfig has layer_types)."""
    fix = "use a DFlash drafter directory (config.json as written by dflash-export or published by z-lab)"
    missing = [k for k in REQUIRED_KEYS if not isinstance(raw.get(k), int)]
    if _value(raw, "mask_token_id") is None:
        missing.append("dflash_config.mask_token_id")
    ids = _value(raw, "target_layer_ids")
    if ids is None and isinstance(raw.get("num_target_layers"), int) and isinstance(raw.get("num_hidden_layers"), int):
        ids = default_target_layers(raw["num_target_layers"], raw["num_hidden_layers"])  # the loaders' default
    if ids is None:
        missing.append("dflash_config.target_layer_ids (or num_target_layers)")
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}", fix)
    arch = raw.get("architectures") or []
    kinds = [KIND_OF_ARCHITECTURE[a] for a in arch if a in KIND_OF_ARCHITECTURE]
    if not kinds:
        raise ConfigError(f"{where}: architectures {arch} is not [\"{ARCHITECTURE}\"] or "
                          f"[\"{ARCHITECTURES['dflash2']}\"] (vLLM and SGLang pick the model class by that name)", fix)
    kind = kinds[0]
    dflash2 = {}
    if kind == "dflash2":  # vLLM reads the four from dflash_config alone (a missing one is its KeyError)
        dc = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
        bad = [k for k in DFLASH2_SHAPE if not (isinstance(dc.get(k), int) and not isinstance(dc.get(k), bool)
                                                and dc.get(k) >= 1)]
        if bad:
            raise ConfigError(f"{where}: a DFlash 2 drafter needs dflash_config.{', dflash_config.'.join(bad)} "
                              "(positive integers; vLLM raises KeyError without them)", fix)
        dflash2 = {k: dc[k] for k in DFLASH2_SHAPE}
    if raw.get("hidden_act", "silu") != "silu" or raw.get("attention_bias", False):
        raise ConfigError(f"{where}: hidden_act {raw.get('hidden_act')!r} / attention_bias "
                          f"{raw.get('attention_bias')!r}: this trainer's drafter is SiLU without biases", fix)
    odd = [f"{k}={_value(raw, k)!r}" for k, neutral in NEUTRAL.items()
           if _value(raw, k, neutral) != neutral and k not in dflash2]
    if odd:
        raise ConfigError(f"{where}: {', '.join(odd)} change the drafter's forward pass and this trainer's "
                          "drafter has no such option", fix)
    n = raw["num_hidden_layers"]
    types = raw.get("layer_types") or [FULL] * n
    if len(types) != n or any(t not in (FULL, SLIDING) for t in types):
        raise ConfigError(f"{where}: layer_types {types} is not {n} x full_attention|sliding_attention", fix)
    window = _value(raw, "sliding_window") if SLIDING in types else None
    if SLIDING in types:
        if "layer_types" not in DrafterConfig.__dataclass_fields__:
            raise ConfigError(f"{where}: layer_types {types} has sliding-attention layers, which this trainer's "
                              "drafter does not have yet", "use a drafter whose layers are all full_attention")
        if not raw.get("use_sliding_window", False) or not window:
            raise ConfigError(f"{where}: sliding-attention layers need sliding_window and use_sliding_window: "
                              "true (transformers drops the window otherwise)", fix)
    # is_causal (else dflash_config.causal, vLLM's order): absent, sliding layers are causal in the block
    # and full ones are not; false, none is (DFlash 2's); true would make full layers causal too
    causal = raw.get("is_causal")
    if causal is None:
        causal = (raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}).get("causal")
    if causal is True and FULL in types:
        raise ConfigError(f"{where}: is_causal true makes its full_attention layers causal in the block, which "
                          "this trainer's drafter does not have", fix)
    rp = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    if (raw.get("rope_scaling") or {}).get("rope_type", "default") not in ("default", None) or \
            rp.get("rope_type", "default") != "default":
        raise ConfigError(f"{where}: rope scaling {raw.get('rope_scaling') or rp} is not the default RoPE of "
                          "this trainer's drafter", fix)
    theta = rp.get("rope_theta", raw.get("rope_theta")) or 1_000_000.0  # vLLM's and SGLang's default
    prov = raw.get(PROVENANCE) if isinstance(raw.get(PROVENANCE), dict) else {}
    d = {
        "hidden_size": raw["hidden_size"], "intermediate_size": raw["intermediate_size"],
        "num_attention_heads": raw["num_attention_heads"], "num_key_value_heads": raw["num_key_value_heads"],
        "head_dim": raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
        "num_hidden_layers": n, "target_layer_ids": [int(x) for x in ids],
        "block_size": int(_value(raw, "block_size", 16)), "mask_token_id": int(_value(raw, "mask_token_id")),
        "vocab_size": raw["vocab_size"], "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta), "target_model": prov.get("target_model", ""),
        "layer_types": list(types), "sliding_window": int(window) if window else None,
        "sliding_window_non_causal": causal is False and SLIDING in types, "drafter_kind": kind, **dflash2,
    }
    if dflash2:  # what speculators, z-lab or vLLM refuse
        problem = dflash2_problem(d["hidden_size"], d["block_size"], d["vocab_size"], dflash2["conv_kernel_size"],
                                  dflash2["conv_group_size"], dflash2["selector_top_k"], name=lambda k: f"dflash_config.{k}")
        if problem:
            raise ConfigError(f"{where}: {problem[0]} (speculators, z-lab or vLLM refuse it)", fix)
    return DrafterConfig.from_dict(d)


def _weight_files(d: Path) -> list[Path]:
    index = d / st_contract.INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{index}: unreadable ({e})", "re-export or re-download the drafter") from e
        return [d / s for s in shards]
    return [d / WEIGHTS]


def read_dflash_dir(path) -> tuple[DrafterConfig, dict]:
    """Validate a DFlash drafter directory without reading tensor data: its config.json and every
    safetensors header (truncation, names, shapes). Returns (DrafterConfig, {file: [names]})."""
    d = Path(path)
    fix = "point at a DFlash drafter directory (config.json + model.safetensors), e.g. one dflash-export wrote"
    try:
        raw = json.loads((d / CONFIG).read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise ConfigError(f"{d}: cannot read {CONFIG} ({getattr(e, 'strerror', None) or e})", fix) from e
    cfg = config_from_dflash(raw, f"{d / CONFIG}")
    shapes, files, problems = {}, {}, []
    for f in _weight_files(d):
        tensors, errs = st_contract.read_header(f)
        problems += [f"{f}: {e}" for e in errs]
        names = []
        for name, info in tensors.items():
            stripped = name[len("model."):] if name.startswith("model.") else name  # SGLang accepts both
            shapes[stripped] = tuple(info["shape"])
            names.append(name)
        files[f] = names
    if problems:
        raise ConfigError("; ".join(problems[:3]), "re-export or re-download the drafter: a weights file is damaged")
    problems = shape_problems(cfg, shapes, str(d))
    if problems:
        raise ConfigError("; ".join(problems), "the directory's config.json and weights must describe one drafter")
    return cfg, files


def load_dflash_dir(path) -> tuple[DrafterConfig, dict]:
    """(DrafterConfig, state dict in our names, fp32) of a DFlash drafter directory, validated by
    read_dflash_dir first. Loads into `drafter.DFlashDrafter(cfg)` with load_state_dict."""
    import torch
    from safetensors.torch import load_file

    cfg, files = read_dflash_dir(path)
    state = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            stripped = name[len("model."):] if name.startswith("model.") else name
            state[our_name(stripped)] = t.to(torch.float32)
    return cfg, state


# ---- --init-from ---------------------------------------------------------------------------------

INIT_FROM_KEYS = (("block_size", "block size", "--block-size"),
                  ("num_hidden_layers", "draft layers", "--num-draft-layers"),
                  ("target_layer_ids", "target_layer_ids", "--target-layers"),
                  ("mask_token_id", "mask_token_id", "--mask-token-id"),
                  ("hidden_size", "hidden size", None), ("vocab_size", "vocab", None),
                  ("intermediate_size", "intermediate size", None),
                  ("num_attention_heads", "attention heads", None), ("num_key_value_heads", "KV heads", None),
                  ("head_dim", "head_dim", None),
                  *((k, k, "--" + k.replace("_", "-")) for k in DFLASH2_SHAPE))


def check_init_from(path: str | None, drafter_config) -> None:
    """Refuse (ConfigError) an --init-from directory (`path`) whose drafter is not the one this run
    builds: block size, draft layers, target_layer_ids, mask id (fix: the flags that match it),
    hidden size, vocab and the layer shapes (fix: its own target). Reads config.json and the
    safetensors headers only. No-op without --init-from (path None)."""
    if not path:
        return
    theirs, _files = read_dflash_dir(path)
    if kind_of(theirs) != kind_of(drafter_config):
        raise ConfigError(f"--init-from {path} is a {KIND_NAMES[kind_of(theirs)]} drafter "
                          f"({ARCHITECTURES[kind_of(theirs)]}) and this run builds {KIND_NAMES[kind_of(drafter_config)]}",
                          f"pass --drafter-kind {kind_of(theirs)}, or drop --init-from")
    problem = layer_ids_problem(theirs.target_layer_ids)
    if problem:
        raise ConfigError(f"--init-from {path}: {problem}", "start from a drafter whose target layers are "
                          "distinct and ascending, or drop --init-from")

    def norm(v):
        return list(v) if isinstance(v, list | tuple) else v

    diffs, flags, other_target = [], [], False
    for key, label, flag in INIT_FROM_KEYS:
        a, b = norm(getattr(theirs, key)), norm(getattr(drafter_config, key))
        if a != b:
            diffs.append(f"{label} {a} there, {b} here")
            if flag:
                flags.append(f"{flag} {','.join(map(str, a)) if isinstance(a, list) else a}")
            else:
                other_target = True
    if layer_types_of(theirs) != layer_types_of(drafter_config):
        diffs.append(f"layer_types {layer_types_of(theirs)} there, {layer_types_of(drafter_config)} here")
    causal = [not getattr(c, "sliding_window_non_causal", False) for c in (theirs, drafter_config)]
    if causal[0] != causal[1]:
        diffs.append(f"sliding layers {'causal' if causal[0] else 'non-causal'} in the block there (is_causal), "
                     f"{'causal' if causal[1] else 'non-causal'} here")
    if diffs:
        fix = ("start from a drafter of this run's target (--target-model), or drop --init-from" if other_target
               else f"pass {' '.join(flags)} to build the same drafter, or drop --init-from")
        raise ConfigError(f"--init-from {path} is a different drafter ({'; '.join(diffs)})", fix)


# ---- the checkpoint side --------------------------------------------------------------------------

def resolve_checkpoint(path) -> Path:
    """A complete checkpoint: `path` itself (verified: manifest, sizes, sha256, header), or the
    newest complete one of a run directory (or of its checkpoints/). Raises ConfigError."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{p} is not a directory", "pass a run directory or checkpoints/step-XXXXXXXX")
    if (p / contract.MANIFEST).exists() or contract.step_of(p.name) is not None or (p / contract.WEIGHTS).exists():
        problems = contract.verify(str(p), check_hashes=True)
        if problems:
            raise ConfigError(f"checkpoint {p} is not complete: {'; '.join(problems)}",
                              "export another checkpoint (dflash-export RUN_DIR takes the newest complete one)")
        return p
    root = p / layout.CHECKPOINTS if (p / layout.CHECKPOINTS).is_dir() else p
    scanned = contract.scan(str(root))
    newest = contract.newest_complete(str(root))
    if newest is None:
        bad = "; ".join(f"{c['name']}: {', '.join(c['problems'])}" for c in scanned[-3:]) or "none at all"
        raise ConfigError(f"{p}: no complete checkpoint under {root} ({bad})",
                          "let the run save one, or pass a checkpoint directory")
    for c in scanned:
        if c["step"] > contract.step_of(Path(newest).name) and c["problems"]:
            print(f"dflash-export: skipping {c['name']} ({'; '.join(c['problems'])})", file=sys.stderr)
    return Path(newest)


def read_checkpoint(ckpt: Path) -> tuple[DrafterConfig, dict]:
    """(DrafterConfig, state dict) of a verified checkpoint, headers checked before any tensor is read."""
    from safetensors.torch import load_file

    try:
        cfg = DrafterConfig.from_dict(json.loads((ckpt / contract.CONFIG).read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"{ckpt / contract.CONFIG}: not a drafter config ({e})", "export another checkpoint") from e
    tensors, errs = st_contract.read_header(str(ckpt / contract.WEIGHTS))
    if errs:
        raise ConfigError(f"{ckpt / contract.WEIGHTS}: {'; '.join(errs)}", "export another checkpoint")
    problems = shape_problems(cfg, {format_name(k): v["shape"] for k, v in tensors.items()},
                              f"{ckpt / contract.WEIGHTS}")
    if problems:
        raise ConfigError("; ".join(problems), "its config.json and drafter.safetensors describe different "
                          "drafters: export another checkpoint")
    return cfg, load_file(str(ckpt / contract.WEIGHTS))


def run_facts(ckpt: Path) -> dict:
    """What the model card says about the run the checkpoint came from, from the run directory
    (run_config.json, status.json, metrics.jsonl; trainer_state.pt's args only as a fallback)."""
    facts = {"step": contract.step_of(ckpt.name), "args": {}, "tau": None, "tokens": None, "data_rows": None}
    try:
        facts["step"] = json.loads((ckpt / contract.MANIFEST).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    run = ckpt.parent.parent if ckpt.parent.name == layout.CHECKPOINTS else None
    if run is not None:
        try:
            facts["args"] = json.loads((run / layout.RUN_CONFIG).read_text())
        except (OSError, ValueError):
            pass
        try:
            recs = metrics_contract.read(run / layout.METRICS)
        except OSError:
            recs = []
        steps = [r for r in recs if metrics_contract.is_step(r) and (r.get("step") or 0) <= (facts["step"] or 0)]
        if steps:
            facts["tokens"] = sum(int(r.get("target_tokens") or 0) for r in steps)
        taus = [r for r in recs if r.get(metrics_contract.TAU) is not None]
        if taus:
            facts["tau"] = taus[-1]
    if not facts["args"]:
        try:
            import torch

            state = torch.load(ckpt / contract.STATE, map_location="cpu", weights_only=False)
            facts["args"] = {k: (v if isinstance(v, int | float | str | bool | None) else str(v))
                             for k, v in dict(state.get("args") or {}).items()}
        except Exception:  # noqa: BLE001 (a model card without settings, not a failed export)
            pass
    data_dir = facts["args"].get("data_dir")
    if data_dir:
        try:
            import pyarrow.parquet as pq

            files = sorted(Path(data_dir).glob("*.parquet"))
            if files:
                facts["data_rows"] = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        except Exception:  # noqa: BLE001 (unknown, not an error)
            pass
    return facts


# ---- serving lines and the model card ---------------------------------------------------------------

def serving_commands(target_path: str, drafter_path: str, block_size: int, sliding: bool = False) -> dict:
    """The vLLM and SGLang command lines that serve the target with this drafter (docs/export.md)."""
    spec = json.dumps({"method": "dflash", "model": str(drafter_path), "num_speculative_tokens": block_size - 1})
    vllm = (("VLLM_USE_V2_MODEL_RUNNER=1 " if sliding else "")
            + f"vllm serve {shlex.quote(str(target_path))} --speculative-config {shlex.quote(spec)} "
            "--attention-backend flash_attn --max-num-batched-tokens 32768")
    sglang = ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang.launch_server "
              f"--model-path {shlex.quote(str(target_path))} --speculative-algorithm DFLASH "
              f"--speculative-draft-model-path {shlex.quote(str(drafter_path))} "
              f"--speculative-num-draft-tokens {block_size} --tp-size 1 --mem-fraction-static 0.75")
    return {"vllm": vllm, "sglang": sglang}


CARD_SETTINGS = ("epochs", "max_steps", "lr", "warmup_ratio", "weight_decay", "grad_accum", "token_budget",
                 "max_seq_len", "max_anchors", "block_size", "num_draft_layers", "target_layers", "mask_token_id",
                 "loss_weighting", "streak_alpha", "decay_gamma", "drafter_kind", *DFLASH2_SHAPE,
                 "selector_loss_alpha", "ce_target", "use_soft_labels", "kl_weight", "kl_temperature",
                 "teacher_fp8", "noise_start", "noise_end", "seed", "data_dir", "init_from")


def model_card(cfg, config: dict, target: dict, run: dict, ckpt: Path, out_dir: Path) -> str:
    b = cfg.block_size
    cmds = serving_commands(target["path"], str(out_dir), b, config["use_sliding_window"])
    tau = run["tau"]
    kind = KIND_NAMES[kind_of(cfg)]
    dflash2 = kind_of(cfg) == "dflash2"
    sglang = (["SGLang: no DFlash 2 support is known to this exporter (its DFLASH loads DFlashDraftModel).", ""]
              if dflash2 else ["SGLang:", "", "    " + cmds["sglang"], ""])
    lines = [
        f"# {kind} drafter for {target['name']}", "",
        f"A {kind} block-diffusion drafter ({cfg.num_hidden_layers} layers, block size {b}) for speculative "
        f"decoding of `{target['name']}` ({target['model_type']}, {target['num_hidden_layers']} layers, vocab "
        f"{target['vocab_size']}), trained by flashfleet. Format: `architectures: "
        f"[\"{ARCHITECTURES[kind_of(cfg)]}\"]`, "
        "bf16 `model.safetensors` without embedding or LM head (the target's are used).", "",
        *([f"DFlash 2: convolutions of {cfg.conv_kernel_size} taps in groups of {cfg.conv_group_size} channels, "
           f"selector rank {cfg.selector_rank}, top-{cfg.selector_top_k}. The block size is part of the format: "
           f"serve it with `num_speculative_tokens` = {b - 1} (vLLM takes the convolution's block position as "
           "row % (num_speculative_tokens + 1)).", ""] if dflash2 else []),
        "| | |", "|---|---|",
        f"| target | `{target['path']}` |",
        f"| features | outputs of target decoder layers {list(cfg.target_layer_ids)} (HF hidden_states[i+1]) |",
        f"| mask token id | {cfg.mask_token_id} |",
        f"| source checkpoint | `{ckpt}` |",
        f"| optimizer steps | {run['step']} |",
        f"| data rows | {run['data_rows'] if run['data_rows'] is not None else 'unknown'} |",
        f"| target tokens trained on | {run['tokens'] if run['tokens'] is not None else 'unknown'} |",
        "| measured tau | " + (f"{tau['tau']:.3f} (greedy, {tau.get('prompts')} prompts, block {tau.get('block_size')}, "
                               f"measured at step {tau.get('step')})" if tau else "not measured") + " |",
        "", "## Serving", "", "vLLM:", "", "    " + cmds["vllm"], "", *sglang,
        "(from z-lab's README; see docs/export.md for the flags that depend on the GPU and the target)", "",
    ]
    dflash2_only = (*DFLASH2_SHAPE, "selector_loss_alpha")
    settings = [(k, run["args"][k]) for k in CARD_SETTINGS if k in run["args"]
                and (dflash2 or k not in dflash2_only)]
    if settings:
        lines += ["## Training settings", "", "| setting | value |", "|---|---|"]
        lines += [f"| {k} | `{v}` |" for k, v in settings]
        lines.append("")
    return "\n".join(lines)


# ---- writing the directory atomically ------------------------------------------------------------------

def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def check_out_dir(out_dir, force: bool) -> Path:
    """Refuse an OUT_DIR that exists (without --force) or cannot be written. Nothing is changed."""
    out = Path(out_dir).absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file, not a directory", "choose another OUT_DIR (a directory path)")
    if out.exists() or out.is_symlink():
        if not force:
            raise ConfigError(f"{out} already exists", "pass --force to replace it, or choose another OUT_DIR")
        if out.is_symlink() or not out.is_dir():
            raise ConfigError(f"{out} exists and is not a directory", "remove it or choose another OUT_DIR")
    probe = out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise ConfigError(f"cannot create {out}: {probe} is not writable", "choose a writable OUT_DIR")
    return out


def write_dir(out: Path, config: dict, tensors: dict, readme: str, force: bool = False) -> Path:
    """config.json, model.safetensors and README.md into a temp dir beside `out`, fsynced, then
    renamed to `out` (with force, swapped with the old one, which is removed after)."""
    from safetensors.torch import save_file

    out = check_out_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        (tmp / README).write_text(readme)
        for name in (WEIGHTS, CONFIG, README):
            os.chmod(tmp / name, 0o644)  # a server running as another user reads them (save_file leaves 0600)
            fsync_file(tmp / name)
        os.chmod(tmp, 0o755)
        fsync_dir(tmp)
        if out.exists():
            if not _exchange(tmp, out):  # no atomic swap here: old aside, new in, then the old removed
                old = out.parent / f".{out.name}.old-{os.getpid()}"
                os.rename(out, old)
                os.rename(tmp, out)
                tmp = old
            fsync_dir(out.parent)
            shutil.rmtree(tmp)  # the old directory, now that the new one is in place
        else:
            os.rename(tmp, out)
            fsync_dir(out.parent)
    except BaseException:
        if tmp.exists() and tmp.name.startswith(f".{out.name}.tmp-"):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_apart(source, out_dir) -> None:
    """An export never replaces or deletes the run it reads from (OUT_DIR = RUN_DIR --force did):
    OUT_DIR must not be the source (a run or a checkpoint, or the run a checkpoint belongs to),
    nor hold it; inside the run it may only be a new path or a previous export outside
    checkpoints/ (collect.yml exports to <run>/drafter, docs/export.md). Symlinks resolved."""
    src = Path(source).resolve()
    out = Path(out_dir).resolve()
    runs = [src] + ([src.parent.parent] if src.parent.name == layout.CHECKPOINTS else [])
    for run in runs:
        if out == run or out in run.parents:
            where = "the same as" if out == run else "above"
        elif run in out.parents and (run / layout.CHECKPOINTS == out or run / layout.CHECKPOINTS in out.parents
                                     or out.exists() and not _is_export(out)):
            where = "inside"
        else:
            continue
        raise ConfigError(f"OUT_DIR {out_dir} is {where} {run}, which the export reads from: writing it would "
                          "replace or delete what the run holds", "choose an OUT_DIR outside the run directory "
                          "(or a new one beside its checkpoints, such as RUN_DIR/drafter)")


def _is_export(d: Path) -> bool:
    """A directory this module wrote (config.json of the format): --force may replace it."""
    try:
        return json.loads((d / CONFIG).read_text()).get("architectures") in ([a] for a in ARCHITECTURES.values())
    except (OSError, ValueError, AttributeError):
        return False


def export(source, out_dir, force: bool = False, target_model=None, log=print) -> Path:
    """The whole export: resolve and verify the checkpoint, read the target, convert, write.
    Every refusal is a ConfigError raised before anything is written."""
    check_apart(source, out_dir)
    out = check_out_dir(out_dir, force)
    ckpt = resolve_checkpoint(source)
    cfg, weights = read_checkpoint(ckpt)
    if not (target_model or cfg.target_model):
        raise ConfigError(f"checkpoint {ckpt} names no target model", "pass --target-model DIR")
    problem = layer_ids_problem(cfg.target_layer_ids)
    if problem:
        raise ConfigError(f"checkpoint {ckpt}: {problem}", "train the drafter again with distinct ascending "
                          "--target-layers; this one can be evaluated (dflash-eval) but not served by vLLM")
    target = target_facts(target_model or cfg.target_model)
    if max(cfg.target_layer_ids) == target["num_hidden_layers"] - 1:
        print(f"dflash-export: warning: target layer {target['num_hidden_layers'] - 1} is the last decoder layer: "
              "this trainer feeds its output before the final norm, z-lab's loop feeds HF hidden_states[L] (after "
              "it), vLLM captures layer outputs inside the decoder loop; the drafter may run differently there",
              file=sys.stderr)
    run = run_facts(ckpt)
    config, tensors = to_dflash(cfg, weights, target, {"source_checkpoint": str(ckpt), "step": run["step"],
                                                       "target_model": str(target["path"])})
    readme = model_card(cfg, config, target, run, ckpt, out)
    write_dir(out, config, tensors, readme, force)
    log(f"dflash-export: wrote {out} from {ckpt} (step {run['step']}, {len(tensors)} tensors, bf16)")
    return out


def check_served_block(cfg, num_speculative_tokens: int | None, where: str) -> None:
    """Refuse serving a DFlash 2 drafter with num_speculative_tokens other than block_size - 1: vLLM
    takes its convolutions' block position as row % (num_speculative_tokens + 1), so another value
    puts the taps at other positions than training did, with no error (a DFlash drafter has no such
    dependence: vLLM may draft fewer tokens than its block)."""
    if kind_of(cfg) == "dflash2" and num_speculative_tokens is not None and \
            num_speculative_tokens != cfg.block_size - 1:
        raise ConfigError(f"{where}: a DFlash 2 drafter of block size {cfg.block_size} served with "
                          f"num_speculative_tokens {num_speculative_tokens}: vLLM would place its convolution taps at "
                          f"row % {num_speculative_tokens + 1}, not at the trained block positions",
                          f"serve it with num_speculative_tokens {cfg.block_size - 1}")


def check_export(path, num_speculative_tokens: int | None = None) -> str:
    """dflash-export --check: the directory as vLLM's and z-lab's loaders read it (config.json's
    keys, every tensor's name and shape, DFlash 2's settings), and the block size it must be served
    with. Raises ConfigError naming the first problem; returns the line to print."""
    cfg, files = read_dflash_dir(path)
    problem = layer_ids_problem(cfg.target_layer_ids)
    if problem:
        raise ConfigError(f"{path}: {problem}", "export a drafter trained with distinct ascending --target-layers")
    check_served_block(cfg, num_speculative_tokens, str(path))
    kind = kind_of(cfg)
    extra = (f"; convolutions of {cfg.conv_kernel_size} taps in groups of {cfg.conv_group_size}, selector rank "
             f"{cfg.selector_rank}, top-{cfg.selector_top_k}" if kind == "dflash2" else "")
    return (f"dflash-export: {path} ok: {ARCHITECTURES[kind]}, {cfg.num_hidden_layers} layers, block size "
            f"{cfg.block_size} (serve with num_speculative_tokens {cfg.block_size - 1}), "
            f"{sum(len(n) for n in files.values())} tensors{extra}")


def main(argv=None) -> int:
    p = CliParser(prog="dflash-export", description="Export a drafter checkpoint to the DFlash "
                                "directory format vLLM, SGLang and z-lab's dflash load (config.json, bf16 "
                                "model.safetensors, README.md model card).",
                                epilog="Exit codes: 0 written; 78 refused (one line on stderr, nothing changed).")
    p.add_argument("source", metavar="CHECKPOINT_OR_RUN_DIR",
                   help="a checkpoint (checkpoints/step-XXXXXXXX) or a run directory (its newest complete checkpoint); "
                   "with --check, the exported directory to check")
    p.add_argument("out_dir", metavar="OUT_DIR", nargs="?", help="the directory to write (must not exist, unless "
                   "--force)")
    p.add_argument("--check", action="store_true", help="write nothing: check the exported directory "
                   "CHECKPOINT_OR_RUN_DIR names as vLLM and z-lab's loaders read it (config keys, tensor names and "
                   "shapes, DFlash 2's settings) and print one line; 78 with the reason if either would reject it")
    p.add_argument("--num-speculative-tokens", type=int, default=None, metavar="N", help="with --check: the "
                   "num_speculative_tokens vLLM will serve the drafter with; a DFlash 2 drafter needs block_size - 1")
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR (atomically: the old one is "
                   "removed only after the new one is in place)")
    p.add_argument("--target-model", default=None, help="the target's local directory (default: the one the "
                   "checkpoint's config.json names); its config.json gives num_target_layers, vocab_size and "
                   "max_position_embeddings")
    try:
        a = p.parse_args(argv)
        if a.check:
            print(check_export(a.source, a.num_speculative_tokens))
            return 0
        if a.out_dir is None:
            raise ConfigError("OUT_DIR is missing", "dflash-export CHECKPOINT_OR_RUN_DIR OUT_DIR (or --check DIR)")
        export(a.source, a.out_dir, a.force, a.target_model)
    except ConfigError as e:
        print(e.line(), file=sys.stderr)
        return EX_CONFIG
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
