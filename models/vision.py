"""The Qwen3-VL vision tower: patch embedding, learned + rotary 2-D positions, ViT blocks, patch merging
and the DeepStack side outputs (transformers' `Qwen3VLVisionModel`, same parameter names).

Shape legend: N patches of all images (sum of t*h*w over `grid_thw` rows), D = C*tp*p*p flattened
patch pixels (channels C, temporal patch tp, patch side p), E vision hidden, nh heads, hd = E/nh,
m spatial merge size, O out_hidden_size (= the text model's hidden size).

    VisionTower(vision_config: dict, deepstack)  # the HF vision_config of a Qwen3-VL / Qwen3.5-style
                                                 # config.json; deepstack: the family's tower has DeepStack
    forward(pixel_values [N, D], grid_thw [n, 3]) -> (embeds [N/m², O], [deepstack_k [N/m², O] ...])

Patches arrive in the image processor's order: per image, m×m blocks of neighbouring patches are
consecutive (block-major), so merging is a reshape of m² consecutive rows. Attention is full
(bidirectional) within each image frame and never across images.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ACT = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu,
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}

DEFAULTS = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
            "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": 3584, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]}
"""transformers' Qwen3VLVisionConfig defaults, for keys a config.json leaves out."""


def vision_settings(config: dict, deepstack: bool = True) -> dict:
    """The HF vision_config with defaults filled in; a tower without DeepStack (`VisionLanguage.deepstack`
    false: transformers' Qwen3_5VisionConfig has no such key) defaults to no DeepStack layers."""
    defaults = DEFAULTS if deepstack else {**DEFAULTS, "deepstack_visual_indexes": []}
    out = {**defaults, **{k: v for k, v in config.items() if v is not None}}
    theta = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    out["rope_theta"] = float(theta)
    return out


class PatchEmbed(nn.Module):
    """Conv3d with stride = kernel over one flattened patch each, i.e. a linear map of its D pixels."""

    def __init__(self, c: dict):
        super().__init__()
        self.proj = nn.Conv3d(c["in_channels"], c["hidden_size"], kernel_size=(c["temporal_patch_size"], c["patch_size"], c["patch_size"]),
                              stride=(c["temporal_patch_size"], c["patch_size"], c["patch_size"]), bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, D] -> [N, E]
        w = self.proj.weight
        return F.linear(x.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.nh = c["num_heads"]
        self.qkv = nn.Linear(c["hidden_size"], 3 * c["hidden_size"], bias=True)
        self.proj = nn.Linear(c["hidden_size"], c["hidden_size"], bias=True)

    def forward(self, x, cos, sin, seqlens: list[int]):  # x [N, E], cos/sin [N, hd]
        N, E = x.shape
        q, k, v = self.qkv(x).reshape(N, 3, self.nh, -1).unbind(1)  # each [N, nh, hd]
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        out = [F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None])[0]
               for qi, ki, vi in zip(q.split(seqlens), k.split(seqlens), v.split(seqlens))]  # [nh, n_i, hd]
        return self.proj(torch.cat(out, dim=1).transpose(0, 1).reshape(N, E))


def _rope(x, cos, sin):
    """HF `apply_rotary_pos_emb_vision`: half-split rotation, computed in fp32."""
    dtype = x.dtype
    x = x.float()
    cos, sin = cos[:, None].float(), sin[:, None].float()
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(dtype)


class VisionMLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.linear_fc1 = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=True)
        self.linear_fc2 = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=True)
        self.act = _ACT[c["hidden_act"]]

    def forward(self, x):
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.norm1 = nn.LayerNorm(c["hidden_size"], eps=1e-6)
        self.norm2 = nn.LayerNorm(c["hidden_size"], eps=1e-6)
        self.attn = VisionAttention(c)
        self.mlp = VisionMLP(c)

    def forward(self, x, cos, sin, seqlens):
        x = x + self.attn(self.norm1(x), cos, sin, seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """m² neighbouring patches -> one text-model token. `postshuffle`: the LayerNorm runs on the
    concatenated m²·E vector (the DeepStack mergers) instead of per patch (the main merger)."""

    def __init__(self, c: dict, postshuffle: bool):
        super().__init__()
        self.width = c["hidden_size"] * c["spatial_merge_size"] ** 2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else c["hidden_size"], eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, c["out_hidden_size"])

    def forward(self, x):  # [N, E] -> [N/m², O]
        x = self.norm(x.reshape(-1, self.width)) if self.postshuffle else self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(nn.Module):
    def __init__(self, vision_config: dict, deepstack: bool = True):
        super().__init__()
        c = self.settings = vision_settings(vision_config, deepstack)
        self.merge = c["spatial_merge_size"]
        self.patch_embed = PatchEmbed(c)
        self.pos_embed = nn.Embedding(c["num_position_embeddings"], c["hidden_size"])
        self.side = int(c["num_position_embeddings"] ** 0.5)
        self.blocks = nn.ModuleList(VisionBlock(c) for _ in range(c["depth"]))
        self.merger = PatchMerger(c, postshuffle=False)
        self.deepstack_visual_indexes = list(c["deepstack_visual_indexes"])
        self.deepstack_merger_list = nn.ModuleList(PatchMerger(c, postshuffle=True) for _ in self.deepstack_visual_indexes)
        self.head_dim = c["hidden_size"] // c["num_heads"]

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor):
        grids = [tuple(int(v) for v in g) for g in grid_thw.tolist()]
        rows, cols = _patch_coords(grids, self.merge, pixel_values.device)
        x = self.patch_embed(pixel_values)
        x = x + self._interpolated_positions(grids, rows, cols).to(x.dtype)
        quarter = self.head_dim // 2  # h and w each rotate a quarter of the head's dims (per half)
        inv_freq = 1.0 / (self.settings["rope_theta"] ** (torch.arange(0, quarter, 2, dtype=torch.float, device=x.device) / quarter))
        freqs = torch.cat((rows[:, None].float() * inv_freq, cols[:, None].float() * inv_freq), -1)
        emb = torch.cat((freqs, freqs), dim=-1)  # [N, hd]
        cos, sin = emb.cos(), emb.sin()
        seqlens = [h * w for t, h, w in grids for _ in range(t)]
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, seqlens)
            if i in self.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack

    def _interpolated_positions(self, grids, rows, cols) -> torch.Tensor:
        """The learned side×side position table resampled to each image's h×w patch grid:
        bilinear with align_corners=True (HF `get_vision_interpolation_indices_and_weights`)."""
        dev = rows.device
        heights = torch.cat([torch.full((t * h * w,), h, device=dev) for t, h, w in grids])
        widths = torch.cat([torch.full((t * h * w,), w, device=dev) for t, h, w in grids])
        s = self.side
        hi, hw = _taps(rows, heights, s)
        wi, ww = _taps(cols, widths, s)
        idx = (hi[:, :, None] * s + wi[:, None, :]).reshape(-1, 4)
        weights = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        return (self.pos_embed(idx) * weights[:, :, None].to(self.pos_embed.weight.dtype)).sum(1)


def _taps(index: torch.Tensor, size: torch.Tensor, side: int):
    """Two bilinear taps (clamped to the table) and their weights along one axis."""
    src = index.float() * (side - 1) / torch.clamp(size - 1, min=1)
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def _patch_coords(grids, merge: int, device):
    """(row, col) of every patch in block-major order (m×m blocks consecutive), frames repeated."""
    rows, cols = [], []
    for t, h, w in grids:
        r = torch.arange(h, device=device)[:, None].expand(h, w)
        c = torch.arange(w, device=device)[None, :].expand(h, w)
        shape = (h // merge, merge, w // merge, merge)
        rows.append(r.reshape(shape).transpose(1, 2).reshape(-1).repeat(t))
        cols.append(c.reshape(shape).transpose(1, 2).reshape(-1).repeat(t))
    return torch.cat(rows), torch.cat(cols)


def merged_tokens(grid: tuple[int, int, int] | list[int], merge: int) -> int:
    """Text-model tokens of one image: t*h*w / m²."""
    t, h, w = (int(v) for v in grid)
    return t * h * w // (merge * merge)

