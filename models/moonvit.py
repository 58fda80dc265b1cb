"""Kimi K2.5's MoonViT vision tower and multimodal projector (transformers' `Kimi_K25VisionModel`
and `Kimi_K25MultimodalProjection`). Parameter names are the checkpoint's (what Moonshot released and
transformers' save_pretrained writes back): `encoder.blocks.{i}.{norm0,norm1,wqkv,wo,mlp.fc0,mlp.fc1}`,
`patch_embed.pos_emb.weight`, `proj.0` / `proj.2`; the fused wqkv keeps its rows as released, so
the rope is the interleaved (complex-pair) one on it, which transformers' half-split rope on its
row-permuted q/k projections (`PermuteForRope`) equals.

Shape legend: N patches of all images (sum of t*h*w over `grid_thw` rows), p patch side, E vision
hidden, nh heads, hd = E/nh, kh×kw the merge kernel, M = N/(kh·kw) merged tokens per frame, O the
text model's hidden size.

    MoonViT(vision_config: dict)                 # the HF vision_config of a kimi_k25 config.json
    forward(pixel_values [N, 3, p, p], grid_thw [n, 3]) -> [M, kh*kw, E]   (kernel groups)
    Projector(E, kh*kw, O, eps)(x [M, kh*kw, E]) -> [M, O]

Patches arrive in raster order per frame (the image processor's `patchify`), unlike Qwen-VL's
merge-block order. Positions: the learned pos_emb_height×pos_emb_width table resampled bicubically
(align_corners=False) to each image's h×w grid, a sinusoid per frame for videos (none for
single-frame images), and 2-D axial rope inside attention (h and w angles interleaved per
frequency). Attention is bidirectional within each clip (all its frames) and never across clips.
The activations are models/vision.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.families.kimi_k25 import vision_settings
from vf.models.vision import _ACT


class PosEmbed(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c["pos_emb_height"], c["pos_emb_width"], c["hidden_size"]))
        self.num_frames = c["pos_emb_time"]

    def time_table(self, device) -> torch.Tensor:
        """[frames+1, E] sinusoids, row 0 zeros (single-frame clips add nothing); transformers keeps
        it as a non-persistent buffer, computed here so meta-device construction needs no init."""
        E = self.weight.shape[-1]
        pos = torch.arange(self.num_frames, dtype=torch.float32, device=device)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, E, 2, dtype=torch.int64, device=device).float() / E))
        freqs = torch.outer(pos, inv_freq)
        return torch.cat([torch.zeros(1, E, device=device), torch.cat([freqs.sin(), freqs.cos()], dim=1)])

    def forward(self, x, grids):  # x [N, E]
        table = self.weight.permute(2, 0, 1)[None]  # [1, E, Hp, Wp]
        times = self.time_table(x.device)
        parts = []
        for t, h, w in grids:
            hw = F.interpolate(table, size=(h, w), mode="bicubic", align_corners=False)[0].flatten(1).t()  # [h*w, E]
            frames = torch.arange(t, device=x.device) + int(t > 1)
            parts.append((hw[None] + times[frames][:, None]).reshape(t * h * w, -1))
        return x + torch.cat(parts).to(x.dtype)


class PatchEmbed(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        p = c["patch_size"]
        self.proj = nn.Conv2d(3, c["hidden_size"], kernel_size=p, stride=p)
        self.pos_emb = PosEmbed(c)

    def forward(self, pixel_values, grids):  # [N, 3, p, p] -> [N, E]
        w = self.proj.weight
        x = F.linear(pixel_values.reshape(pixel_values.shape[0], -1).to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)
        return self.pos_emb(x, grids)


def _rope_pairs(x, cos, sin):
    """Rotate each (2j, 2j+1) pair of a head by angle j, in fp32 (x [N, nh, hd], cos/sin [N, hd/2])."""
    dtype = x.dtype
    x = x.float().unflatten(-1, (-1, 2))
    cos, sin = cos[:, None].float(), sin[:, None].float()
    a, b = x[..., 0], x[..., 1]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2).to(dtype)


class Attention(nn.Module):
    """The released block's fused q/k/v (`wqkv`) and output (`wo`) projections; not an nn.Module
    of its own in the checkpoint, so the block holds the weights and this is its forward."""

    @staticmethod
    def forward(block, x, cos, sin, seqlens: list[int]):  # x [N, E], cos/sin [N, hd/2]
        N, E = x.shape
        q, k, v = block.wqkv(x).reshape(N, 3, block.nh, -1).unbind(1)  # each [N, nh, hd]
        q, k = _rope_pairs(q, cos, sin), _rope_pairs(k, cos, sin)
        out = [F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1))
               for qi, ki, vi in zip(q.split(seqlens), k.split(seqlens), v.split(seqlens))]  # [nh, n_i, hd]
        return block.wo(torch.cat(out, dim=1).transpose(0, 1).reshape(N, E))


class MLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.fc0 = nn.Linear(c["hidden_size"], c["intermediate_size"])
        self.fc1 = nn.Linear(c["intermediate_size"], c["hidden_size"])
        self.act = _ACT[c["hidden_act"]]

    def forward(self, x):
        return self.fc1(self.act(self.fc0(x)))


class Block(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        E = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.norm0 = nn.LayerNorm(E, eps=1e-5)
        self.norm1 = nn.LayerNorm(E, eps=1e-5)
        self.wqkv = nn.Linear(E, 3 * E)
        self.wo = nn.Linear(E, E)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, seqlens):
        x = x + Attention.forward(self, self.norm0(x), cos, sin, seqlens)
        return x + self.mlp(self.norm1(x))


class Encoder(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.final_layernorm = nn.LayerNorm(c["hidden_size"], eps=1e-5)


class MoonViT(nn.Module):
    def __init__(self, vision_config: dict):
        super().__init__()
        c = self.settings = vision_settings(vision_config)
        self.kernel = tuple(int(k) for k in c["merge_kernel_size"])
        self.head_dim = c["hidden_size"] // c["num_attention_heads"]
        self.patch_embed = PatchEmbed(c)
        self.encoder = Encoder(c)

    def rotary(self, grids, device):
        """cos/sin [N, hd/2], one angle per (2j, 2j+1) pair: per frequency the w angle then the h angle."""
        rows = torch.cat([torch.arange(h, device=device).repeat_interleave(w).repeat(t) for t, h, w in grids])
        cols = torch.cat([torch.arange(w, device=device).repeat(h * t) for t, h, w in grids])
        quarter = self.head_dim // 2
        theta = float(self.settings["rope_parameters"].get("rope_theta", 10000.0))
        inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float, device=device) / quarter))
        freqs = torch.stack((cols[:, None].float() * inv_freq, rows[:, None].float() * inv_freq), dim=-1).flatten(1)
        return freqs.cos(), freqs.sin()

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        grids = [tuple(int(v) for v in g) for g in grid_thw.tolist()]
        x = self.patch_embed(pixel_values, grids)
        cos, sin = self.rotary(grids, x.device)
        seqlens = [t * h * w for t, h, w in grids]
        for block in self.encoder.blocks:
            x = block(x, cos, sin, seqlens)
        return self.merge(self.encoder.final_layernorm(x), grids)

    def merge(self, x, grids) -> torch.Tensor:
        """[N, E] -> [M, kh*kw, E]: each kh×kw block of a clip's patches, averaged over its frames
        (in fp32, as transformers' temporal_merge)."""
        kh, kw = self.kernel
        out = []
        for chunk, (t, h, w) in zip(x.split([t * h * w for t, h, w in grids]), grids):
            blocks = (chunk.float() * (1.0 / t)).reshape(t, h // kh, kh, w // kw, kw, -1).sum(0)
            out.append(blocks.permute(0, 2, 1, 3, 4).reshape((h // kh) * (w // kw), kh * kw, -1))
        return torch.cat(out).to(x.dtype)


class Projector(nn.Module):
    """LayerNorm per patch, then the kh*kw patches of a block concatenated through a GELU MLP
    (`proj.0`, GELU, `proj.2`: the released nn.Sequential's indices)."""

    def __init__(self, hidden: int, group: int, out: int, eps: float):
        super().__init__()
        self.width = hidden * group
        self.pre_norm = nn.LayerNorm(hidden, eps=eps)
        self.proj = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out))

    def forward(self, x):  # [M, kh*kw, E] -> [M, O]
        return self.proj(self.pre_norm(x).reshape(x.shape[0], self.width))
