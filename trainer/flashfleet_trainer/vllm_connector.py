"""The KV connector a vLLM target server runs with (server side; imported by vLLM, never by the trainer).

vLLM's `extract_hidden_states` speculative method caches the chosen layers' hidden states, and
its ExampleHiddenStatesConnector writes them, per request, to a safetensors file whose path comes
back in the completion's `kv_transfer_params` (vllm_target.py reads it). This subclass, passed with
`"kv_connector_module_path": "flashfleet_trainer.vllm_connector"`, changes two things:

- every file also records the layer ids it holds (vllm_target.LAYER_IDS_KEY), so the trainer
  refuses a server started for other layers instead of training on the wrong features;
- on a CPU build (no CUDA) the copy out of the cache is a plain synchronous copy: the parent's
  asynchronous device-to-host path pins host memory (which needs an accelerator) and polls a
  CUDA event that vLLM's CPU runner does not provide.

Start the server in its default multiprocess mode: with VLLM_ENABLE_V1_MULTIPROCESSING=0 a file
is written only on a later engine step, which a lone request never causes.
"""

from functools import partial

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)

from .vllm_format import HIDDEN_KEY, LAYER_IDS_KEY, TOKENS_KEY


class _Done:
    """A finished copy, for the parent's bookkeeping of copy events (the CPU copy is synchronous)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def _write(layer_ids, tensors, event, filename, lock_fd):
    """The parent's writer with the layer ids added; closing lock_fd releases the reader's wait."""
    import os

    try:
        event.synchronize()
        save_file({**tensors, LAYER_IDS_KEY: torch.tensor(layer_ids, dtype=torch.int64)}, filename)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


class FlashfleetHiddenStatesConnector(ExampleHiddenStatesConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        hf = vllm_config.speculative_config.draft_model_config.hf_config
        self._write_tensors = partial(_write, list(hf.eagle_aux_hidden_state_layer_ids))

    def _submit_async_write(self, pending):
        if torch.cuda.is_available():
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return None
        import os

        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size)[None, :] + blocks[:, None] * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {HIDDEN_KEY: hidden, TOKENS_KEY: pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:  # as the parent does: a reader must find the lock held
            import fcntl

            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        future = self._executor.submit(self._write_tensors, tensors, _Done(), pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
        return None
