"""Nemotron-H's decoder layer: one mixer per layer, chosen by `config.layer_types[i]`:
"linear_attention" a Mamba-2 mixer (mamba2.py), "full_attention" GQA attention without rotary
(position comes from the Mamba layers), "mlp" a non-gated squared-ReLU MLP, "moe" the MoE runtime
(moe.py: sigmoid router with expert bias, relu² experts, a relu² shared expert; with
`moe_latent_size` (Nemotron-H Super) the routed experts run in that latent width between
moe.py's latent_in / latent_out projections, the router and shared expert on the hidden state).

    x = x + mixer(norm(x))        norm: RMSNorm;  parameters under `layers.{i}.norm` / `layers.{i}.mixer`

The Qwen "Next" hybrids (Qwen3-Next, Qwen3.5) keep the usual attention + MLP layer
(transformer.DecoderLayer) with `deltanet.GatedDeltaNet` as the attention of their linear layers.
"""

from __future__ import annotations

from torch import nn
from vf.models.config import ModelConfig
from vf.models.layers import MLP, Attention, RMSNorm
from vf.models.mamba2 import Mamba2Mixer
from vf.models.moe import MoE


class MixerLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.kind = config.layer_types[layer_idx]
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.kind == "linear_attention":
            self.mixer = Mamba2Mixer(config, layer_idx)
        elif self.kind == "full_attention":
            self.mixer = Attention(config, layer_idx, rope=False)
        elif self.kind == "moe":
            self.mixer = MoE(config, config.moe_impl_for(layer_idx))
        else:
            self.mixer = MLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias, act="relu2")

    @property
    def cache_kind(self) -> str | None:
        return {"linear_attention": "state", "full_attention": "kv"}.get(self.kind)

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        h = self.norm(x)
        if self.cache_kind is None:
            return x + self.mixer(h)
        return x + self.mixer(h, cos, sin, mask, cache, position_ids)
