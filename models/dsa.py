"""DeepSeek sparse attention (DSA) as GLM-5 (`glm_moe_dsa`) runs it: MLA whose keys are cut, per
query, to the `index_topk` keys a small indexer scores highest.

Shape legend as in mla.py, plus ni index_n_heads, di index_head_dim, k index_topk.
Indexer parameters (native `layers.{i}.attn.indexer.*` = HF `model.layers.{i}.self_attn.indexer.*`):
  wq_b [ni*di, rq]   reads MLA's normed q latent      wk [di, H]   k_norm LayerNorm(di, eps 1e-6)
  weights_proj [ni, H] (computed in fp32, as transformers keeps it)
Per query t and visible key s (transformers' GlmMoeDsaIndexer):
  q_i = wq_b(q_lat) per head [di], k_i = k_norm(wk(x)) [di] (one key shared by all index heads)
  both rope'd on their FIRST dr dims (interleaved pairs, like MLA's rope part), the rest pass
  score(t, s) = sum_h w_h(t) * relu(q_i,h(t)·k_i(s) / sqrt(di)),   w(t) = weights_proj(x_t) / sqrt(ni)
  selected(t) = top-k of score(t, ·) over the keys t may see (k = min(index_topk, S): an early query
                that sees fewer keys keeps them all); exact ties go to the earlier key, the order
                torch.topk gives them on CUDA (see `top_k_mask`)
The attention mask is then visible & selected; everything else is MLA unchanged. The selection is
a hard, non-differentiable choice (transformers runs the indexer under no_grad), so the indexer
weights get no gradient and training leaves them as loaded.
The engine cache stores the indexer key as a third latent stream (1, di) next to MLA's two.
Layers whose `indexer_types` entry is "shared" (the IndexCache schedule of later GLM checkpoints)
have no indexer and reuse the selection of the nearest earlier "full" layer, as transformers does.
The full layer keeps its last selection on itself (`self.selection`); that is also what an
activation-checkpointed shared layer recomputes with, because backward recomputes layers in reverse
and so reaches the shared layer before its full layer has been recomputed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.layers import ShardedMask, apply_rope
from vf.models.mla import MLAttention, deinterleave

INDEX_NORM_EPS = 1e-6


class Indexer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ni, self.di, self.dr = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
        self.topk = config.index_topk
        self.wq_b = nn.Linear(config.q_lora_rank, self.ni * self.di, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.di, bias=False)
        self.k_norm = nn.LayerNorm(self.di, eps=INDEX_NORM_EPS)
        self.weights_proj = nn.Linear(config.hidden_size, self.ni, bias=False)

    def _rope(self, x, cos, sin):  # [B, h, T, di]: rotate the first dr dims (interleaved pairs)
        return torch.cat((apply_rope(deinterleave(x[..., : self.dr]), cos, sin), x[..., self.dr :]), dim=-1)

    def key(self, x, cos, sin):  # [B, T, H] -> [B, 1, T, di]
        return self._rope(self.k_norm(self.wk(x))[:, None], cos, sin)

    @torch.no_grad()
    def index_scores(self, x, q_lat, keys, cos, sin, visible):
        """x [B, T, H], q_lat [B, T, rq], keys [B, 1, S, di], visible bool [B|1, 1, T, S]
        -> fp32 [B, T, S]: each query's score of every key, -inf where it may not look."""
        B, T, _ = x.shape
        q = self._rope(self.wq_b(q_lat).view(B, T, self.ni, self.di).transpose(1, 2), cos, sin)  # [B, ni, T, di]
        scores = F.relu(q.transpose(1, 2).float() @ keys.float().transpose(-1, -2) * self.di**-0.5)  # [B, T, ni, S]
        w = F.linear(x.float(), self.weights_proj.weight.float()) * self.ni**-0.5  # [B, T, ni]
        index = (w.unsqueeze(-2) @ scores).squeeze(-2)  # [B, T, S]
        return index.masked_fill(~visible[:, 0], float("-inf"))

    def select(self, x, q_lat, keys, cos, sin, visible):
        """As `index_scores` -> bool [B, 1, T, S]: the top-k visible keys of each query."""
        return top_k_mask(self.index_scores(x, q_lat, keys, cos, sin, visible), self.topk)[:, None]


def top_k_mask(index: torch.Tensor, k: int) -> torch.Tensor:
    """index scores [..., S] (-inf: not visible) -> bool [..., S]: the k highest visible entries,
    exact ties to the earlier key.

    Ties are exact where every index head's ReLU is 0: the score is then exactly 0, for many keys of
    a row at once, and no small change of the weights moves it. Tiny configs with few index heads
    hit this at the k-th place often, real ones (32-64 index heads) rarely. transformers selects
    with `torch.topk`, whose order of ties is unspecified: on CUDA, where the reference models run,
    it takes the tied values in index order (TensorTopK.cu's gatherTopK: every value above the k-th,
    then "the first seen set" of equal ones), which is the order here; on CPU it takes whatever
    std::nth_element / std::partial_sort leave, which depends on the row's length, so there
    transformers' logits for a prefix change when more tokens follow it (its full forward and its
    cached generate disagree). A stable sort gives the earlier key whatever the row's length or
    padding, so a packed row, a padded engine batch, a cached decode step and a context-parallel
    shard all pick what a lone full forward picks (tests/test_indexed_selection.py)."""
    top = index.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros_like(index, dtype=torch.bool).scatter_(-1, top, True) & (index > float("-inf"))


class DSAttention(MLAttention):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        types = config.indexer_types or ["full"] * config.num_layers
        self.indexer = Indexer(config) if types[layer_idx] == "full" else None
        # shared layers read their full layer's selection; set by NativeModel (see link_shared_indexers)
        self.source: tuple[DSAttention, ...] = (self,)
        self.selection: torch.Tensor | None = None
        self.sparse = True  # False: attend to every visible key (the selection switched off)

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        q, q_lat, latent, k_rope = self.project(x, cos, sin)
        sharded = isinstance(mask, ShardedMask)  # context parallel: this rank's queries, every rank's keys
        if sharded:
            latent, k_rope = mask.gather(latent, k_rope)
        if self.indexer is None:
            if cache is not None:  # the indexer-key stream stays empty on shared layers
                (latent, k_rope, _), mask = cache.store(self.layer_idx, latent, k_rope, latent.new_zeros(
                    *latent.shape[:3], self.source[0].indexer.di))
            selection = self.source[0].selection
        else:
            keys = self.indexer.key(x, cos, sin)
            if sharded:
                (keys,) = mask.gather(keys)
            if cache is not None:
                (latent, k_rope, keys), mask = cache.store(self.layer_idx, latent, k_rope, keys)
        if sharded:
            mask = mask.visible
        T, S = q.shape[2], latent.shape[2]
        if hasattr(mask, "dense"):  # a packed-documents layout object (layers.Documents): its bool mask
            mask = None if mask.single else mask.dense()
        if mask is None:  # plain causal over a block with no earlier keys
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)[None, None]
        if self.indexer is not None:
            selection = self.selection = self.indexer.select(x, q_lat, keys, cos, sin, mask)
        if self.sparse:
            mask = mask & selection
        return self.attend(q, latent, k_rope, mask, causal_none=False)


def link_shared_indexers(attns: list[DSAttention]) -> None:
    """Point every shared layer at the nearest earlier full layer (in layer order)."""
    full = None
    for a in attns:
        if a.indexer is not None:
            full = a
        a.source = (full,)
