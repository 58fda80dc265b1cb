"""Hash routing (DeepSeek-V4's first `mlp_layer_types == "hash_moe"` layers): a frozen token-id ->
expert-ids table chooses the experts; the learned gate only weights them.

Shape legend: N tokens, H hidden, E routed experts, k experts per token, V vocabulary.
Parameters (native `layers.{i}.mlp.router.*`, HF `model.layers.{i}.ffn.gate.*`):
  weight [E, H]     the gate, scored like the top-k router (sqrt(softplus), softmax or sigmoid)
  tid2eid [V, k]    int64, frozen (requires_grad=False): the experts of each token id
Per token t with id v (transformers' DeepseekV4HashRouter):
  idx = tid2eid[v];  w = scores(t)[idx] / Σ scores(t)[idx] · routed_scaling_factor
The table is a parameter (not a buffer) so it loads, saves and syncs to the engine with the
weights; being integer, dtype casts (`model.to(bf16)`) leave it alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.moe import router_scores


class HashRouter(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        E, H, k = config.num_experts, config.hidden_size, config.num_experts_per_tok
        self.num_experts, self.top_k, self.scoring = E, k, config.router_scoring
        self.scale = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(E, H))
        self.tid2eid = nn.Parameter(torch.zeros(config.vocab_size, k, dtype=torch.int64), requires_grad=False)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, H], token_ids [N] -> (weights [N, k] fp32, expert ids [N, k], confidence [N]), as
        `moe.Router`."""
        scores = router_scores(F.linear(x.float(), self.weight.float()), self.scoring)
        idx = self.tid2eid[token_ids].long()
        w = scores.gather(1, idx)
        with torch.no_grad():
            confidence = w.sum(-1) / scores.sum(-1)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * self.scale, idx, confidence
