"""The linear-attention state of a hybrid target (Qwen3.5/3.6, Qwen3-Next) kept at the committed position.

A Gated-DeltaNet layer's cache is not a list of positions: it is a fixed-size recurrent state (one
matrix per head) and the short convolution's last inputs, both of which a forward overwrites with
the state after its last token. A verify pass over [anchor, drafts] therefore leaves them at the
last draft, and a rejection cannot be cropped away as a full-attention layer's keys can.

`LinearStates` keeps them right:
- before the verify pass, `snapshot()` copies every linear layer's conv and recurrent state (the
  state at the committed position; a few MiB per layer, nothing per token);
- during the pass, `capture()` records each linear layer's mixer input (the output of the layer's
  input norm), which at an accepted position is exactly what a pass over the committed tokens
  alone would give it: every layer is causal;
- after acceptance, `advance(n)` puts the snapshot back and runs each linear layer's mixer (its
  projections, convolution, delta rule and output projection; not the MLPs, not the full-attention
  layers, not the rest of the model) over its recorded input at the first n positions, the
  committed ones, so the state moves over the accepted tokens only. When every drafted token is
  accepted (n = the verified length) the pass already left the right state and nothing is re-run.

The full-attention layers' keys and values stay in the same transformers DynamicCache and are
cropped back to the committed length (`crop_attention`), as for a Qwen3 target.

The cache layout read here (a DynamicCache whose linear layers hold `conv_states[0]` and
`recurrent_states[0]`, written in place) is transformers 5.x's; `supports` says whether a target has
it, and a target without it is evaluated uncached.
"""

from contextlib import contextmanager

import torch


def _is_linear(layer) -> bool:
    return hasattr(layer, "recurrent_states") and hasattr(layer, "conv_states")


def linear_layer_ids(config) -> list[int]:
    """Decoder layer ids whose layer_types entry is linear attention (empty for a plain transformer)."""
    types = getattr(config, "layer_types", None) or []
    return [i for i, t in enumerate(types) if t == "linear_attention"]


def supports(config, decoder) -> bool:
    """Whether the target is a hybrid whose linear layers this module can keep: linear_attention
    layers in its config, each a decoder layer with a `linear_attn` mixer, and a transformers
    DynamicCache that gives those layers linear-attention cache layers."""
    ids = linear_layer_ids(config)
    if not ids or not all(hasattr(decoder.layers[i], "linear_attn") for i in ids):
        return False
    from transformers import DynamicCache

    layers = getattr(DynamicCache(config=config), "layers", None)
    return layers is not None and len(layers) > max(ids) and all(_is_linear(layers[i]) for i in ids)


def crop_attention(cache, tokens_to_remove: int) -> None:
    """Remove the last tokens_to_remove positions from every full-attention layer's keys and
    values (a linear layer has no positions to remove)."""
    if tokens_to_remove <= 0:
        return
    for layer in cache.layers:
        if not _is_linear(layer):
            layer.crop(-tokens_to_remove)  # a negative crop removes that many (transformers 5.x)


class LinearStates:
    """The linear layers of one hybrid target replica (`decoder`) and its `cache`: snapshot,
    capture, advance (see the module's docstring)."""

    def __init__(self, decoder, config, cache):
        self.cache = cache
        self.mixers = {i: decoder.layers[i].linear_attn for i in linear_layer_ids(config)}
        self.saved, self.inputs, self.verified = None, {}, 0

    def _states(self, i):
        layer = self.cache.layers[i]
        return layer.conv_states[0], layer.recurrent_states[0]

    def snapshot(self) -> None:
        self.saved = {i: tuple(t.clone() for t in self._states(i)) for i in self.mixers}

    @contextmanager
    def capture(self):
        """Record each linear mixer's input during the forward run inside the block."""
        self.inputs = {}

        def keep(i):
            def hook(_m, args, kwargs):
                self.inputs[i] = args[0] if args else kwargs["hidden_states"]
            return hook

        hooks = [m.register_forward_pre_hook(keep(i), with_kwargs=True) for i, m in self.mixers.items()]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
        self.verified = next(iter(self.inputs.values())).shape[1] if self.inputs else 0

    @torch.no_grad()
    def advance(self, n: int) -> None:
        """Leave every linear layer's state at the snapshot advanced over the first n positions of
        the captured pass (n = committed tokens this cycle)."""
        if self.saved is None:
            raise RuntimeError("advance() without a snapshot() before the pass")
        if n < self.verified:
            for i, mixer in self.mixers.items():
                for live, kept in zip(self._states(i), self.saved[i], strict=True):
                    live.copy_(kept)
                if n > 0:
                    mixer(self.inputs[i][:, :n], self.cache)
        self.saved, self.inputs, self.verified = None, {}, 0
