"""HF <-> native tensor-name mapping, as one explicit table.

Shape legend: H hidden, V vocab, nh/nkv heads, hd head_dim, I intermediate, E experts, Im expert
intermediate. `{i}` is the layer index, `{e}` the expert index.

Ops:
  rename  native tensor == the single HF tensor
  concat  native = cat(HF tensors, dim 0)            (qkv_proj [(nh+2nkv)*hd, H], gate_up_proj [2I, H],
                                                     MLA qkv_a_proj [rq + rkv + dr, H])
  stack   native[e] = cat(HF tensors of expert e, 0) (experts gate_up_proj [E, 2Im, H], down_proj [E, H, Im])
  deinterleave    native = (x[..., 0::2], x[..., 1::2]) concatenated on the last dim
                  (GPT-OSS gate_up_proj_bias [E, 2Im]: HF interleaves gate and up columns)
  deinterleave_t  deinterleave, then swap the last two dims (GPT-OSS gate_up_proj: HF [E, H, 2Im]
                  interleaved -> native [E, 2Im, H])
  transpose       swap the last two dims (GPT-OSS down_proj: HF [E, Im, H] -> native [E, H, Im])
  row_shards      native = cat(HF row blocks shard_0, shard_1, ..., dim 0); saved as
                  torch.chunk(native, split_ngram_parts) (qwen4_exp's n-gram tables, as transformers)
  fused_experts   Qwen3-VL-MoE's fused experts: saved as transformers holds them (native layout,
                  gate_up_proj [E, 2Im, H], down_proj [E, H, Im]: what its save_pretrained writes), or
                  transposed as the released checkpoints store them ([E, H, 2Im], [E, Im, H]: what
                  vLLM reads); read transposed unless the tensor already has the native shape
                  (transformers' `Transpose(1, 2, check_dims=True)`), written in the layout read
                  (`config.experts_transposed`)
  regroup_qkvzba  Qwen3-Next's linear-attention in_proj_qkvz [2kd + 2vd, H] and in_proj_ba [2nv, H]
                  group their rows per key head ([q_g, k_g, v_g, z_g] and [b_g, a_g]); native
                  `in_proj` takes the rows part by part (q, k, v, z, b, a: models/deltanet.py)
Every op is a permutation, so the way back is exact. `table_for(config)` is TABLE with the
family's rows (`Family.weights`, models/families/). Loading also accepts transformers-5 fused expert tensors
(`ALT_SOURCES`); saving writes the layout transformers itself saves (per-expert tensors for Qwen3-MoE,
GLM-4.5, DeepSeek-V3 and DeepSeek-V4, stacked ones for GPT-OSS), so load -> save -> load is bit-exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from vf.models.config import ModelConfig
from vf.models.errors import ModelLoadError
from vf.models.families import resolve

L = "model.layers.{i}."
# native name template -> (op, [HF name templates])
TABLE: dict[str, tuple[str, list[str]]] = {
    "embed_tokens.weight": ("rename", ["model.embed_tokens.weight"]),
    "norm.weight": ("rename", ["model.norm.weight"]),
    "lm_head.weight": ("rename", ["lm_head.weight"]),  # absent when tie_word_embeddings
    "layers.{i}.attn_norm.weight": ("rename", [L + "input_layernorm.weight"]),
    "layers.{i}.mlp_norm.weight": ("rename", [L + "post_attention_layernorm.weight"]),
    "layers.{i}.attn.qkv_proj.weight": ("concat", [L + f"self_attn.{p}_proj.weight" for p in "qkv"]),
    "layers.{i}.attn.qkv_proj.bias": ("concat", [L + f"self_attn.{p}_proj.bias" for p in "qkv"]),
    "layers.{i}.attn.o_proj.weight": ("rename", [L + "self_attn.o_proj.weight"]),
    "layers.{i}.attn.o_proj.bias": ("rename", [L + "self_attn.o_proj.bias"]),
    "layers.{i}.attn.q_norm.weight": ("rename", [L + "self_attn.q_norm.weight"]),
    "layers.{i}.attn.k_norm.weight": ("rename", [L + "self_attn.k_norm.weight"]),
    "layers.{i}.mlp.gate_up_proj.weight": ("concat", [L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"]),
    "layers.{i}.mlp.gate_up_proj.bias": ("concat", [L + "mlp.gate_proj.bias", L + "mlp.up_proj.bias"]),
    "layers.{i}.mlp.down_proj.weight": ("rename", [L + "mlp.down_proj.weight"]),
    "layers.{i}.mlp.down_proj.bias": ("rename", [L + "mlp.down_proj.bias"]),
    "layers.{i}.mlp.router.weight": ("rename", [L + "mlp.gate.weight"]),
    "layers.{i}.mlp.gate_up_proj": (
        "stack",
        [L + "mlp.experts.{e}.gate_proj.weight", L + "mlp.experts.{e}.up_proj.weight"],
    ),
    "layers.{i}.mlp.down_proj": ("stack", [L + "mlp.experts.{e}.down_proj.weight"]),
}


def derived_hf_tensors(config: ModelConfig) -> dict[str, torch.Tensor]:
    """HF tensors that are functions of the config (`Family.derived_tensors`, e.g. qwen4_exp's n-gram
    tables): written on save, compared on load."""
    hook = config.family.derived_tensors
    if not hook:
        return {}
    prefix = VL_TEXT_PREFIX if config.vision is not None else "model."
    return {prefix + name: t for name, t in resolve(hook)(config).items()}


# Vision-language families: the text model's HF names live under `model.language_model.` (not
# `model.`) and the vision tower's under `model.visual.` with the native names of models/vision.py.
VL_TEXT_PREFIX = "model.language_model."
VISION_TABLE = {"visual.{rest}": ("rename", ["model.visual.{rest}"])}


def table_for(config: ModelConfig) -> dict[str, tuple[str, list[str]]]:
    table = {**TABLE, **config.family.weights}
    vl = config.vl
    if vl is not None and vl.table is not None:  # a VL checkpoint with its own layout
        return vl.table(table, config)
    if vl is not None:
        table = {k: (op, [VL_TEXT_PREFIX + s.removeprefix("model.") if s.startswith("model.") else s for s in srcs])
                 for k, (op, srcs) in table.items()}
        table.update(VISION_TABLE)
    return table


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)


def _interleave(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=-1)
    return torch.stack((a, b), dim=-1).reshape(t.shape)


# permutation ops: (HF -> native, native -> HF)
PERMUTE = {
    "deinterleave": (_deinterleave, _interleave),
    "deinterleave_t": (lambda t: _deinterleave(t).transpose(-1, -2), lambda t: _interleave(t.transpose(-1, -2))),
    "transpose": (lambda t: t.transpose(-1, -2), lambda t: t.transpose(-1, -2)),
}

def _qkvzba_sizes(config: ModelConfig) -> tuple[list[int], list[int]]:
    """Per-key-head row counts of Qwen3-Next's in_proj_qkvz (q, k, v, z) and in_proj_ba (b, a)."""
    r = config.linear_num_value_heads // config.linear_num_key_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    return [dk, dk, r * dv, r * dv], [r, r]


def _regroup_to_native(parts: list[torch.Tensor], config: ModelConfig) -> torch.Tensor:
    nk, (qkvz, ba) = config.linear_num_key_heads, _qkvzba_sizes(config)
    a = parts[0].reshape(nk, sum(qkvz), -1).split(qkvz, dim=1)  # per part [nk, rows, H]
    b = parts[1].reshape(nk, sum(ba), -1).split(ba, dim=1)
    return torch.cat([p.reshape(-1, p.shape[-1]) for p in (*a, *b)], dim=0)


def _regroup_to_hf(t: torch.Tensor, config: ModelConfig) -> list[torch.Tensor]:
    nk, (qkvz, ba) = config.linear_num_key_heads, _qkvzba_sizes(config)
    parts = t.split([nk * n for n in qkvz + ba], dim=0)
    grouped = [p.reshape(nk, -1, p.shape[-1]) for p in parts]
    return [torch.cat(grouped[:4], dim=1).reshape(-1, t.shape[-1]), torch.cat(grouped[4:], dim=1).reshape(-1, t.shape[-1])]


def _fused_experts_to_native(t: torch.Tensor, native_template: str,
                             config: ModelConfig) -> tuple[torch.Tensor, bool]:
    """(a fused expert tensor in the native layout, whether it was transposed): as is when it has the
    native shape, else with its last two dims swapped (a square one, 2Im == H or Im == H, reads as
    native, as in transformers)."""
    E, H, Im = config.num_experts, config.hidden_size, config.moe_intermediate_size
    native = (E, 2 * Im, H) if native_template.endswith("gate_up_proj") else (E, H, Im)
    if tuple(t.shape) == native or t.ndim != 3:  # a misshapen tensor is reported by the loader's shape check
        return t, False
    return t.transpose(1, 2).contiguous(), True


# transformers-5 in-memory fused experts (same layout as native), accepted when loading
ALT_SOURCES: dict[str, str] = {
    "layers.{i}.mlp.gate_up_proj": L + "mlp.experts.gate_up_proj",
    "layers.{i}.mlp.down_proj": L + "mlp.experts.down_proj",
}
# HF tensors that are runtime buffers, never weights
IGNORED_HF = re.compile(r"(rotary_emb\.inv_freq|\.attn\.bias|\.masked_bias)$")


def _rest_prefixes(table: dict) -> list[str]:
    """The prefixes of the table's "prefix.{rest}" rows (a vision tower's names), longest first."""
    return sorted((k.removesuffix("{rest}") for k in table if k.endswith("{rest}")), key=len, reverse=True)


def _template(native_name: str, rest_prefixes: list[str]) -> tuple[str, dict[str, str]]:
    """(the table row's template, its fields) for a native tensor name: a "prefix.{rest}" row
    (matched whole), else a decoder layer's "layers.{i}." row."""
    for prefix in rest_prefixes:
        if native_name.startswith(prefix):
            return prefix + "{rest}", {"rest": native_name.removeprefix(prefix)}
    m = re.match(r"layers\.(\d+)\.(.*)", native_name)
    if not m:
        return native_name, {}
    return f"layers.{{i}}.{m.group(2)}", {"i": m.group(1)}


def _split_sizes(native_template: str, config: ModelConfig, n_parts: int, rows: int) -> list[int]:
    if "qkv_proj" in native_template:
        q = config.num_heads * config.head_dim * (2 if config.attn_output_gate else 1)
        return [q] + [config.num_kv_heads * config.head_dim] * 2
    if native_template.endswith("attn.in_proj.weight"):  # Qwen3.5 linear attention: qkv, z, b, a
        kd, vd = config.linear_num_key_heads * config.linear_key_head_dim, config.linear_num_value_heads * config.linear_value_head_dim
        return [2 * kd + vd, vd, config.linear_num_value_heads, config.linear_num_value_heads]
    if "qkv_a_proj" in native_template:
        return [config.q_lora_rank, config.kv_lora_rank + config.qk_rope_head_dim]
    return [rows // n_parts] * n_parts


def hf_to_native(
    native_names: list[str],
    get: Callable[[str], torch.Tensor],
    has: Callable[[str], bool],
    config: ModelConfig,
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Build the native state dict for `native_names` from HF tensors (fetched with `get`).
    Returns (state dict, HF names used). Missing HF tensors raise ModelLoadError."""
    out, used, missing = {}, set(), []
    if config.vl is not None and config.vl.detect is not None:  # which of its layouts the checkpoint has
        config.vl.detect(config, has)
    table = table_for(config)
    prefixes = _rest_prefixes(table)
    for name in native_names:
        tmpl, fmt = _template(name, prefixes)
        if tmpl not in table:
            raise ModelLoadError(f"no HF mapping for native tensor {name!r}")
        op, sources = table[tmpl]
        alt = {**ALT_SOURCES, **config.family.fused_sources}.get(tmpl) if op == "stack" else None
        if op == "stack":
            alt = alt and alt.format(**fmt)
            if alt and has(alt):
                out[name] = get(alt)
                used.add(alt)
                continue
            per_expert, first_keys = [], []
            for e in range(config.num_experts):
                keys = [s.format(e=e, **fmt) for s in sources]
                absent = [k for k in keys if not has(k)]
                if absent:
                    missing += absent
                    break
                per_expert.append(_cat([get(k) for k in keys], keys, name))
                first_keys.append(keys[0])
                used.update(keys)
            else:
                out[name] = _stack_experts(per_expert, first_keys, name)
            continue
        if op == "row_shards":
            keys = []
            while has(sources[0].format(k=len(keys), **fmt)):
                keys.append(sources[0].format(k=len(keys), **fmt))
            if not keys:
                missing.append(sources[0].format(k=0, **fmt))
                continue
            out[name] = torch.cat([get(k) for k in keys], dim=0)
            used.update(keys)
            continue
        keys = [s.format(**fmt) for s in sources]
        absent = [k for k in keys if not has(k)]
        if absent:
            missing += absent
            continue
        if op == "rename":
            out[name] = get(keys[0])
        elif op == "concat":
            out[name] = _cat([get(k) for k in keys], keys, name)
        elif op == "regroup_qkvzba":
            out[name] = _regroup_to_native([get(k) for k in keys], config)
        elif op == "fused_experts":
            out[name], transposed = _fused_experts_to_native(get(keys[0]), tmpl, config)
            config.experts_transposed |= transposed  # saving writes the layout the checkpoint had
        else:
            out[name] = PERMUTE[op][0](get(keys[0])).contiguous()
        used.update(keys)
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ModelLoadError(
            f"checkpoint lacks {len(missing)} tensor(s) the {config.architecture} model needs: {shown}"
        )
    for key, want in derived_hf_tensors(config).items():
        if has(key):
            got = get(key)
            if tuple(got.shape) != tuple(want.shape) or not torch.equal(got.long(), want):
                raise ModelLoadError(f"checkpoint tensor {key} differs from the one its config derives "
                                     "(the n-gram table would be read at the wrong rows)",
                                     hint="the checkpoint does not match its config.json")
            used.add(key)
    return out, used


def _cat(tensors: list[torch.Tensor], keys: list[str], name: str) -> torch.Tensor:
    """cat(HF tensors, dim 0), or a ModelLoadError naming them when their shapes do not fit together
    (a misshapen tensor: the loader's shape check only sees the result)."""
    try:
        return torch.cat(tensors, dim=0)
    except RuntimeError:
        shapes = ", ".join(f"{k} {tuple(t.shape)}" for k, t in zip(keys, tensors))
        raise ModelLoadError(f"the tensors of {name} do not fit together: {shapes}") from None


def _stack_experts(per_expert: list[torch.Tensor], keys: list[str], name: str) -> torch.Tensor:
    """stack(per-expert tensors), or a ModelLoadError naming the experts whose shape differs from the most common."""
    shapes = [tuple(t.shape) for t in per_expert]
    usual = max(set(shapes), key=shapes.count)
    odd = [f"{k} {s}" for k, s in zip(keys, shapes) if s != usual]
    if odd:
        raise ModelLoadError(f"experts of {name} differ in shape (most are {usual}): {', '.join(odd[:5])}")
    return torch.stack(per_expert)


def native_to_hf(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Native state dict -> HF-named tensors (contiguous clones safe to save)."""
    out = {}
    table = table_for(config)
    prefixes = _rest_prefixes(table)
    for name, t in state.items():
        tmpl, fmt = _template(name, prefixes)
        op, sources = table[tmpl]
        if op == "rename" or (op == "fused_experts" and not config.experts_transposed):
            out[sources[0].format(**fmt)] = t
        elif op == "fused_experts":
            out[sources[0].format(**fmt)] = t.transpose(1, 2)
        elif op in PERMUTE:
            out[sources[0].format(**fmt)] = PERMUTE[op][1](t)
        elif op == "row_shards":
            for k, part in enumerate(t.chunk(config.split_ngram_parts, dim=0)):
                out[sources[0].format(k=k, **fmt)] = part
        elif op == "regroup_qkvzba":
            for src, part in zip(sources, _regroup_to_hf(t, config)):
                out[src.format(**fmt)] = part
        elif op == "concat":
            sizes = _split_sizes(tmpl, config, len(sources), t.shape[0])
            for s, part in zip(sources, t.split(sizes, dim=0)):
                out[s.format(**fmt)] = part
        else:  # stack
            for e in range(t.shape[0]):
                for s, part in zip(sources, t[e].chunk(len(sources), dim=0)):
                    out[s.format(e=e, **fmt)] = part
    out.update(derived_hf_tensors(config))
    return {k: v.detach().contiguous() for k, v in out.items()}
