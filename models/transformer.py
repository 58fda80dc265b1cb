"""The native decoder-only transformer (every family shares it; config flags pick the parts).

Per layer: attention is `layers.Attention` (Qwen3, Llama, GLM-4.5), `mla.MLAttention`
(DeepSeek-V3), `dsa.DSAttention` (GLM-5: MLA with indexed sparse attention),
`gpt_oss.SinkAttention` (GPT-OSS), or for the hybrids (Qwen3-Next, Qwen3.5) gated attention or
`deltanet.GatedDeltaNet` by `config.layer_types`; the MLP is `layers.MLP` or `moe.MoE`
(`config.is_moe_layer`), its compute path per layer from `config.moe_impl`. Nemotron-H layers are
`hybrid.MixerLayer` (one mixer each: Mamba-2, attention, MLP or MoE); DeepSeek-V4's are
`deepseek_v4.DeepseekV4Layer` (hyper-connection streams) in its `DeepseekV4Model` subclass.
Engine caches: `cache_kinds()` says per layer whether it keeps keys/values ("kv"), recurrent state
("state", shapes from `state_shapes()`) or nothing (None).

Shape legend: B batch, T tokens per row, H hidden, V vocab, hd head_dim.
  forward(input_ids [B,T], position_ids [B,T] | None, cache) -> hidden [B,T,H] (final norm applied)
  compute_logits(...) -> [B,T,V]; lm_head_weight -> [V,H] (the embedding when tied)
Packed rows: when position_ids restart at 0 inside a row, each restart opens a new document and
attention is causal within documents: the layers get a `layers.Documents` layout as their opaque
`mask` and `layers.sdpa` runs one causal SDPA per document (no T×T mask).
Activation checkpointing (`model.activation_checkpointing = True`): while grad is enabled and no
KV cache is used, each decoder layer keeps only its input and recomputes its inside during
backward (torch.utils.checkpoint, non-reentrant). Same values and grads; about one more forward
of the layers in time, and the activations of one layer instead of all of them in memory.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from vf.models.config import ModelConfig
from vf.models.layers import MLP, Attention, Embedding, RMSNorm, Rotary, positions_and_mask
from vf.models.moe import MoE, check_impl


def attention_class(config: ModelConfig, layer_idx: int = 0):
    if config.zero_centered_norm and config.layer_types[layer_idx] == "linear_attention":
        from vf.models.deltanet import GatedDeltaNet

        return GatedDeltaNet
    if config.dsa:
        from vf.models.dsa import DSAttention

        return DSAttention
    if config.mla:
        from vf.models.mla import MLAttention

        return MLAttention
    if config.attention_sinks:
        from vf.models.gpt_oss import SinkAttention

        return SinkAttention
    return Attention


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        zc = config.zero_centered_norm
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, zc)
        self.attn = attention_class(config, layer_idx)(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, zc)
        if config.is_moe_layer(layer_idx):
            self.mlp = MoE(config, config.moe_impl_for(layer_idx))
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    @property
    def cache_kind(self) -> str:
        return "state" if hasattr(self.attn, "state_shapes") else "kv"

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, position_ids)
        return x + self.mlp(self.mlp_norm(x))


def decoder_layer(config: ModelConfig, layer_idx: int) -> nn.Module:
    if config.architecture == "deepseek_v4":  # hyper-connection streams (models/deepseek_v4.py)
        from vf.models.deepseek_v4 import DeepseekV4Layer

        return DeepseekV4Layer(config, layer_idx)
    if config.architecture == "qwen4_exp_text":  # gated residual streams, PLE (models/qwen4_exp.py)
        from vf.models.qwen4_exp import Qwen4ExpLayer

        return Qwen4ExpLayer(config, layer_idx)
    if config.architecture == "nemotron_h":
        from vf.models.hybrid import MixerLayer

        return MixerLayer(config, layer_idx)
    return DecoderLayer(config, layer_idx)


class NativeModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # _weight skips nn.Embedding's normal_ init (on the meta device its first call costs ~1.5 s)
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(decoder_layer(config, i) for i in range(config.num_layers))
        if config.dsa:
            from vf.models.dsa import link_shared_indexers

            link_shared_indexers([layer.attn for layer in self.layers])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        self.rotary = Rotary(config)
        self.activation_checkpointing = False  # per-layer recompute in backward (see module doc)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H]
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_moe_impl(self, impl: str | list[str]) -> None:
        """Switch the MoE layers to `impl` ("grouped" | "loop", or a list with one per decoder layer)."""
        self.config.set_moe_impl(impl)
        for i, layer in enumerate(self.layers):
            moe = getattr(layer, "mlp", None) or getattr(layer, "mixer", None)  # nemotron_h: one mixer per layer
            if isinstance(moe, MoE):
                moe.impl = check_impl(self.config.moe_impl_for(i))

    def kv_streams(self) -> list[tuple[int, int]]:
        """(heads, dim) of each tensor an engine KV cache stores per token and layer (`cache.store`)."""
        c = self.config
        if c.mla:  # DSA adds its indexer key
            return [(1, c.kv_lora_rank), (1, c.qk_rope_head_dim)] + ([(1, c.index_head_dim)] if c.dsa else [])
        return [(c.num_kv_heads, c.head_dim), (c.num_kv_heads, c.head_dim)]

    def cache_kinds(self) -> list[str | None]:
        """Per decoder layer: "kv" (keys/values, `kv_streams`), "state" (recurrent, `state_shapes`) or None."""
        return [layer.cache_kind for layer in self.layers]

    def state_shapes(self) -> dict[int, list[tuple[tuple[int, ...], torch.dtype | None]]]:
        """layer -> per-row shapes (and dtypes, None = the model's) of the recurrent state it caches."""
        return {i: (layer.attn if hasattr(layer, "attn") else layer.mixer).state_shapes()
                for i, layer in enumerate(self.layers) if layer.cache_kind == "state"}

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None
    ) -> torch.Tensor:
        T = input_ids.shape[1]
        position_ids, mask = positions_and_mask(input_ids, position_ids, cache)
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(position_ids, x.dtype)
        x = self.run_layers(x, cos, sin, mask, cache=cache, position_ids=position_ids)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.norm(x)

    def run_layers(self, x: torch.Tensor, *args, cache=None, **kwargs) -> torch.Tensor:
        """x through every decoder layer, `layer(x, *args, cache=cache, **kwargs)`; with activation
        checkpointing (grad enabled, no cache) each layer recomputes in backward."""
        if self.activation_checkpointing and cache is None and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            for layer in self.layers:
                x = checkpoint(layer, x, *args, use_reentrant=False, **kwargs)
        else:
            for layer in self.layers:
                x = layer(x, *args, cache=cache, **kwargs)
        return x

    def compute_logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None):
        return self.forward(input_ids, position_ids, cache) @ self.lm_head_weight.t()  # [B, T, V]


def init_weights(model: NativeModel, seed: int | None = None, std: float = 0.02) -> NativeModel:
    """Normal(0, std) for matrices, embeddings, attention sinks and SSM/DeltaNet decay parameters,
    zeros for biases (also expert and router biases) and integer tables, ones for norms (zeros for
    zero-centred ones: HF's init)."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    zero_centered = {id(m.weight) for m in model.modules() if getattr(m, "zero_centered", False)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():  # integer tables (DeepSeek-V4's hash routing): zeros, as transformers
                p.zero_()
            elif re.search(r"norm\d?\.weight$", name):  # RMSNorm and (vision) LayerNorm weights
                p.fill_(0.0 if id(p) in zero_centered else 1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))
    return model


def model_class(config: ModelConfig) -> type[NativeModel]:
    """NativeModel, or its subclass for DeepSeek-V4, Qwen3.8 Flash Next or a model with a vision tower."""
    if config.architecture == "deepseek_v4":
        from vf.models.deepseek_v4 import DeepseekV4Model

        return DeepseekV4Model
    if config.architecture == "qwen4_exp_text":
        from vf.models.qwen4_exp import Qwen4ExpModel, Qwen4ExpVLModel

        return Qwen4ExpModel if config.vision is None else Qwen4ExpVLModel
    if config.vl_architecture == "kimi_k25":  # kimi_k25 (registry)
        from vf.models.kimi_k25 import KimiK25Model

        return KimiK25Model
    if config.vision is not None:
        from vf.models.qwen3_vl import Qwen3VLModel

        return Qwen3VLModel
    return NativeModel


def build_model(
    config: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu", seed: int | None = None
):
    """Random-initialised NativeModel from a native config (`seed` for a reproducible init)."""
    with torch.device("meta"):
        model = model_class(config)(config)
    model = model.to_empty(device=device).to(dtype)
    return init_weights(model, seed)
