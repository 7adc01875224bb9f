"""The hand-over between a vLLM target server and the trainer: one owner for its names and ids.

Imported by both sides: vllm_connector.py (inside the vLLM server, which writes a safetensors file
per request) and vllm_target.py (the trainer, which reads it). Standard library only, so vLLM's
own environment can import it.

Layer ids. The trainer names a feature layer by its 0-based decoder layer i (the output of layer
i, transformers' hidden_states[i + 1]); vLLM's `eagle_aux_hidden_state_layer_ids` name the input
of a layer, so the same output is vLLM id i + 1, and vLLM id L (the target's layer count) is the
last layer's output before the final norm, which the trainer normalises itself for soft labels.
"""

HIDDEN_KEY = "hidden_states"  # [tokens, layers, hidden], in the server's dtype (vLLM's own key)
TOKENS_KEY = "token_ids"  # [tokens]: the prompt the states belong to (vLLM's own key)
LAYER_IDS_KEY = "flashfleet_layer_ids"  # [layers]: the vLLM ids of HIDDEN_KEY's layers, in order
CONNECTOR = "FlashfleetHiddenStatesConnector"
CONNECTOR_MODULE = "flashfleet_trainer.vllm_connector"


def server_layer_ids(layer_ids, num_layers: int) -> list[int]:
    """The vLLM ids a server extracts for a run's feature layers: each feature layer's output and the
    last layer's (soft labels need it; one more layer per token costs the server little), sorted
    and distinct (vLLM's order)."""
    return sorted({i + 1 for i in layer_ids} | {num_layers})
