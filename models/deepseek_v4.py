"""DeepSeek-V4 (`deepseek_v4`): shared key=value attention with sinks over a sliding window plus, in
compressed layers, pooled entries of the whole past (compressed_attention.py); hyper-connection
residual streams (hyper_connections.py); MoE layers with sqrt-softplus top-k or hash routing
(hash_routing.py) and clipped SwiGLU experts. Mirrors transformers' modeling_deepseek_v4.

Shape legend: B batch, T tokens, H hidden, nh heads, hd head_dim, rq q_lora_rank, g o_groups,
r o_lora_rank, W sliding_window, n hc_mult, S keys stored, Nw compressed entries.

Attention per layer (`config.layer_types[i]`: sliding_attention | compressed_sparse_attention (CSA) |
heavily_compressed_attention (HCA)); parameters under `layers.{i}.attn.`:
  q latent  q_lat = rmsnorm(q_a_proj(x)) [rq];  q = q_b_proj(q_lat) [nh, hd], each head RMS-normed
            without weight, then roped on its last rd dims (interleaved pairs, `rope_tail`)
  key=value kv = rope(kv_norm(kv_proj(x))) [1, hd]: one head, used as both key and value
  keys      the W latest tokens (itself included) and, in CSA/HCA layers, the compressor's entries
            the query may see (CSA: only the indexer's top-k of them)
  softmax   over q·k/sqrt(hd) plus a per-head sink logit `sinks` [nh] that takes mass but has no value
  output    rotated back by the query's rope angle on the last rd dims (values carry rope, K=V),
            then the grouped projection: heads split into g groups of nh/g, o_a_proj maps each
            group to r dims (block-diagonal: weight [g·r, nh·hd/g]), o_b_proj [H, g·r] mixes them
  sliding layers use the main rope (rope_theta), compressed ones the compress rope
  (compress_rope_theta, maybe yarn) for q, kv and their entries.
Decoder layer: the residual is n streams [B, T, n, H] mixed in/out by `attn_hc` and `mlp_hc`; the
model expands the embeddings to n copies and collapses them with `hc_head` before the final norm.

Engine cache (`cache.store`, see models/cache.py): every layer stores per token its key=value
[1, hd]; compressed layers also the compressor's kv and gate projections, CSA layers the
indexer's (`cache_streams`). Each step the entries are pooled again from those stored projections
(a softmax-weighted sum per window: elementwise work, no projection is recomputed). Keys are at
absolute positions (key j = position j): a row's stored window and entries are exact whatever its
length, and the window / visibility masks come from the query positions. The stored streams are
per token, so the cache saves compute, not memory: it holds (1 + 4 [CSA] or 2 [HCA]) x hd numbers
per token and layer, more than transformers' compressed cache.
Packed rows (training): the sequence-mixing part runs per document (each from position 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.compressed_attention import Compressor, Indexer, half_rope, rope_tail, visible_entries
from vf.models.config import ModelConfig
from vf.models.families.deepseek_v4 import CSA, SLIDING, compress_rope_config
from vf.models.gpt_oss import attend_with_sinks, sink_window_bias
from vf.models.hash_routing import HashRouter
from vf.models.hyper_connections import HyperConnection, HyperHead, expand, unweighted_rms_norm
from vf.models.layers import Documents, RMSNorm, Rotary, ShardedMask, positions_and_mask
from vf.models.moe import MoE
from vf.models.transformer import NativeModel


def cache_streams(config: ModelConfig) -> list[tuple[int, int]]:
    """(heads, dim) of each per-token stream an engine cache keeps: the key=value, then (compressed
    layers) compressor kv / gate, then (CSA layers) indexer kv / gate. Every layer stores a prefix
    of the list; HCA projections are zero-padded to the CSA width when both kinds are present."""
    kinds, hd = set(config.layer_types), config.head_dim
    streams = [(1, hd)]
    if kinds - {SLIDING}:
        streams += [(1, 2 * hd if CSA in kinds else hd)] * 2
    if CSA in kinds:
        streams += [(1, 2 * config.index_head_dim)] * 2
    return streams


class DeepseekV4Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx, self.kind = layer_idx, config.layer_types[layer_idx]
        H, nh, hd, rq = config.hidden_size, config.num_heads, config.head_dim, config.q_lora_rank
        self.nh, self.hd, self.window, self.eps = nh, hd, config.sliding_window, config.rms_norm_eps
        self.groups, self.rank = config.o_groups, config.o_lora_rank
        self.q_a_proj = nn.Linear(H, rq, bias=False)
        self.q_a_norm = RMSNorm(rq, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(rq, nh * hd, bias=False)
        self.kv_proj = nn.Linear(H, hd, bias=False)
        self.kv_norm = RMSNorm(hd, config.rms_norm_eps)
        self.o_a_proj = nn.Linear(nh * hd // self.groups, self.groups * self.rank, bias=False)
        self.o_b_proj = nn.Linear(self.groups * self.rank, H, bias=False)
        self.sinks = nn.Parameter(torch.empty(nh))
        self.rope = "main" if self.kind == SLIDING else "compress"
        self.compressor = self.indexer = None
        if self.kind != SLIDING:
            rate = config.compress_rates[self.kind]
            self.compressor = Compressor(config, hd, rate, overlap=self.kind == CSA)
            self.rotary = Rotary(compress_rope_config(config))  # the entries' rope (positions w·rate)
            if self.kind == CSA:
                self.indexer = Indexer(config, rate)
        self.widths = [w for _, w in cache_streams(config)]

    def forward(self, x, rope, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        B, T, _ = x.shape
        cos, sin = rope[self.rope]
        q_lat = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(q_lat).view(B, T, self.nh, self.hd).transpose(1, 2)
        q = rope_tail(unweighted_rms_norm(q, self.eps), cos, sin)  # [B, nh, T, hd]
        streams = [rope_tail(self.kv_norm(self.kv_proj(x))[:, None], cos, sin)[:, 0]]  # [B, T, hd]
        queries = None
        if self.compressor is not None:
            streams += self.compressor.project(x)
        if self.indexer is not None:  # only chooses entries (a hard top-k): no gradient, as in transformers
            with torch.no_grad():
                streams += self.indexer.compressor.project(x)
                queries = self.indexer.queries(x, q_lat, *rope["compress"])
        streams = [F.pad(s, (0, w - s.shape[-1]))[:, None] for s, w in zip(streams, self.widths)]  # [B, 1, T, w]
        allowed = None
        if cache is not None:
            streams, allowed = cache.store(self.layer_idx, *streams)
            if allowed is not None:  # [B|1, T, S]
                allowed = allowed.reshape(-1, allowed.shape[-2], allowed.shape[-1])
        if isinstance(mask, ShardedMask):  # context parallel: every rank's key side, this rank's queries
            out = self.mix_sharded(q, list(mask.gather(*streams)), position_ids, queries, mask)
        else:
            out = self.mix_documents(q, streams, allowed, position_ids, queries, mask)
        out = rope_tail(out, cos, -sin).transpose(1, 2).reshape(B, T, self.groups, -1)  # [B, T, g, nh·hd/g]
        out = torch.einsum("btgi,gri->btgr", out, self.o_a_proj.weight.view(self.groups, self.rank, -1))
        return self.o_b_proj(out.reshape(B, T, self.groups * self.rank))

    @torch.compiler.disable  # a graph break under `--model.compile`, as layers.sdpa: the per-document
    # loop and the data-dependent selection stay eager, so compiled blocks never recompile for a packing
    def mix_documents(self, q, streams, allowed, position_ids, queries, mask):
        """`mix` over the whole batch, or per document of packed rows (a `layers.Documents` mask)."""
        if not isinstance(mask, Documents) or mask.single:
            return self.mix(q, streams, allowed, position_ids, queries)
        return torch.cat([torch.cat([
            self.mix(q[b : b + 1, :, s:e], [t[b : b + 1, :, s:e] for t in streams], None, position_ids[b : b + 1, s:e],
                     None if queries is None else [t[b : b + 1, s:e] for t in queries])
            for s, e in row], dim=2) for b, row in enumerate(mask.spans)], dim=0)

    @torch.compiler.disable
    def mix_sharded(self, q, streams, position_ids, queries, mask):
        """Context parallelism: `streams` are the whole rows' key side [B, 1, T, w] (gathered), q and
        `queries` this rank's columns. Per document: this rank's queries in it against the whole
        document's keys (its compressed entries pooled from every rank's tokens), as `mix` on one
        process; the outputs go back to this rank's column order."""
        columns = mask.columns  # [Tl] global columns of this rank's queries
        rows = []
        for b, spans in enumerate(mask.documents.spans):
            parts, where = [], []
            for s, e in spans:
                mine = ((columns >= s) & (columns < e)).nonzero()[:, 0]  # local indices, ascending
                if mine.numel() == 0:
                    continue
                parts.append(self.mix(q[b : b + 1, :, mine], [t[b : b + 1, :, s:e] for t in streams], None,
                                      position_ids[b : b + 1, mine],
                                      None if queries is None else [t[b : b + 1, mine] for t in queries]))
                where.append(mine)
            rows.append(torch.cat(parts, dim=2).index_select(2, torch.argsort(torch.cat(where))))
        return torch.cat(rows, dim=0)

    def mix(self, q, streams, allowed, position_ids, queries):
        """q [B, nh, T, hd]; streams [B, 1, S, width] of tokens at positions 0..S-1; allowed bool
        [B|1, T, S] (the cache's valid keys) or None; position_ids [B, T] -> [B, nh, T, hd]."""
        kv = streams[0][:, 0]  # [B, S, hd]
        key_pos = torch.arange(kv.shape[1], device=kv.device)
        p = position_ids[..., None]
        allow = (key_pos <= p) & (key_pos > p - self.window)  # [B, T, S]
        if allowed is not None:
            allow = allow & allowed
        if self.compressor is not None:
            w = self.compressor.width
            entries = self.compressor.pool(streams[1][:, 0, :, :w], streams[2][:, 0, :, :w], self.rotary)
            visible = visible_entries(position_ids, entries.shape[1], self.compressor.rate)
            if self.indexer is not None:
                with torch.no_grad():
                    keys = self.indexer.compressor.pool(streams[3][:, 0], streams[4][:, 0], self.rotary)
                visible = self.indexer.select(*queries, keys, visible)
            kv, allow = torch.cat((kv, entries), dim=1), torch.cat((allow, visible), dim=-1)
        kv = kv[:, None]
        bias = sink_window_bias(position_ids, allow[:, None], kv.shape[2], None, self.sinks.to(q.dtype))
        return attend_with_sinks(q, kv, kv, bias)


class DeepseekV4Layer(nn.Module):
    cache_kind = "kv"

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = DeepseekV4Attention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config, config.moe_impl_for(layer_idx))
        self.hashed = config.mlp_layer_types[layer_idx] == "hash_moe"
        if self.hashed:
            self.mlp.router = HashRouter(config)
        self.attn_hc = HyperConnection(config)
        self.mlp_hc = HyperConnection(config)

    def forward(self, h, rope, mask=None, cache=None, position_ids=None, input_ids=None):  # [B, T, n, H]
        x, post, comb = self.attn_hc(h)
        h = self.attn_hc.merge(h, self.attn(self.attn_norm(x), rope, mask, cache, position_ids), post, comb)
        x, post, comb = self.mlp_hc(h)
        return self.mlp_hc.merge(h, self.mlp(self.mlp_norm(x), input_ids if self.hashed else None), post, comb)


class DeepseekV4Model(NativeModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)  # embeddings, DeepseekV4Layer layers, final norm, main rope, head
        self.compress_rotary = Rotary(compress_rope_config(config))
        self.hc_head = HyperHead(config)

    def kv_streams(self) -> list[tuple[int, int]]:
        return cache_streams(self.config)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        T = input_ids.shape[1]
        position_ids, mask = positions_and_mask(input_ids, position_ids, cache)
        x = self.embed_tokens(input_ids)
        rope = {"main": half_rope(self.rotary, position_ids, x.dtype),
                "compress": half_rope(self.compress_rotary, position_ids, x.dtype)}
        h = self.run_layers(expand(x, self.config.hc_mult), rope, mask, cache=cache, position_ids=position_ids,
                            input_ids=input_ids)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.norm(self.hc_head(h))
