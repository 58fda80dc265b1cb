"""Load an HF model directory (config.json + model.safetensors or sharded with
model.safetensors.index.json) into a NativeModel; save a NativeModel back in HF layout.

Shape legend: see convert.py (all tensors keep their HF shapes on disk).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from vf.models.config import ModelConfig
from vf.models.convert import IGNORED_HF, hf_to_native, native_to_hf
from vf.models.errors import ModelLoadError, read_json_object, under_root
from vf.models.families import native_model_types
from vf.models.transformer import NativeModel, model_class

from vf.bounded import load_json

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def read_config(path: str | os.PathLike) -> ModelConfig:
    path = Path(path)
    cfg_file = path / "config.json"
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist", hint="pass a local HF model directory")
    if not cfg_file.is_file():
        raise ModelLoadError(
            f"{cfg_file} is missing", hint="an HF model directory needs config.json + safetensors"
        )
    return ModelConfig.from_hf_dict(read_json_object(cfg_file), source=str(cfg_file))


def _damaged(f: Path, e: Exception) -> ModelLoadError:
    return ModelLoadError(f"{f} is damaged or not a safetensors file: {e}",
                          hint="re-download or re-save the checkpoint")


def _shard(path: Path, name: object, root: Path | None) -> Path:
    """The shard file an index names: a relative path inside the model directory (HF writes bare
    file names), never absolute or through `..`; a symlink may point elsewhere only when no
    weights root confines the load (the HF hub cache links shards to its blobs directory)."""
    rel = Path(name) if isinstance(name, str) and name and "\x00" not in name else None
    if rel is None or rel.is_absolute() or ".." in rel.parts:
        raise ModelLoadError(f"{path / INDEX} names shard {str(name)[:200]!r} outside the model directory",
                             hint="an index names shard files inside the model directory")
    return under_root(path / rel, root)


def _weight_files(path: Path, root: Path | None = None) -> dict[str, Path]:
    """HF tensor name -> file holding it (every file under `root`, when given)."""
    if (path / INDEX).is_file():
        try:
            weight_map = load_json(under_root(path / INDEX, root).read_bytes())["weight_map"]
            names = set(weight_map.values())
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{path / INDEX} is not a valid shard index ({type(e).__name__}: {e})") from None
        files = {f: _shard(path, f, root) for f in names}
        absent = sorted(f for f, p in files.items() if not p.is_file())
        if absent:
            raise ModelLoadError(
                f"{path / INDEX} lists shard(s) that are missing: {', '.join(absent)}",
                hint="re-download or re-save the checkpoint so every shard is present",
            )
        return {k: files[f] for k, f in weight_map.items()}
    if (path / SINGLE).is_file():
        under_root(path / SINGLE, root)
        try:
            with safe_open(path / SINGLE, "pt") as f:
                return {k: path / SINGLE for k in f.keys()}  # noqa: SIM118 (safetensors handle)
        except (OSError, SafetensorError) as e:
            raise _damaged(path / SINGLE, e) from None
    raise ModelLoadError(
        f"no weights in {path}: expected {SINGLE} or {INDEX}",
        hint="only safetensors checkpoints are supported",
    )


IMPLS = ("auto", "native", "hf")
_NOTIFIED: set[str] = set()


def resolve_impl(path: str | os.PathLike, impl: str = "auto") -> str:
    """"native" or "hf" for the model at `path` under `--model.impl` (auto | native | hf).

    auto: native where `model_type` is a native family, else the transformers fallback with a
    one-line notice on stderr of what is slower; native on another family: ModelLoadError (exit 2)
    naming the families we have."""
    if impl not in IMPLS:
        raise ModelLoadError(f"unknown model implementation {impl!r}", hint=f"use one of: {', '.join(IMPLS)}")
    cfg_file = Path(path) / "config.json"
    try:
        model_type = load_json(cfg_file.read_bytes()).get("model_type")
    except (OSError, ValueError, AttributeError):  # unreadable, not UTF-8, not JSON (BoundsError), not an object
        return "native"  # read_config reports what is wrong with the directory
    if impl == "hf" or model_type in native_model_types():
        return impl if impl != "auto" else "native"
    if impl == "native":
        raise ModelLoadError(f"{cfg_file}: model_type {model_type!r} has no native implementation",
                             hint=f"native families: {', '.join(native_model_types())}; --model.impl auto or hf runs "
                                  "any causal LM transformers implements")
    from vf.models.hf_fallback import SLOWER

    if model_type not in _NOTIFIED:  # once per process (trainer and engines load the same model)
        _NOTIFIED.add(model_type)
        print(f"vf: model_type {model_type!r} has no native implementation; running it through transformers "
              f"(slower: {SLOWER})", file=sys.stderr)
    return "hf"


def load_model(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32, device="cpu", moe_impl: str | None = None,
    impl: str = "auto", root: str | os.PathLike | None = None,
) -> NativeModel:
    """HF directory -> NativeModel (eval mode) with q/k/v and gate/up fused and experts stacked; or,
    for a family we have no native model of (`impl` auto/hf, see `resolve_impl`), an `HFModel`.

    `root` (vf-serve's --weights-root): every file the load reads must resolve under it; a file
    of the directory (or a shard its index names) that leads elsewhere is refused, exit 2 / 4xx."""
    path = Path(path)
    if root is not None:
        root = Path(root).resolve()
        under_root(path, root)
        for entry in sorted(path.iterdir()) if path.is_dir() else []:
            under_root(entry, root)  # config, tokenizer and processor files too, whoever reads them
    if resolve_impl(path, impl) == "hf":
        from vf.models.hf_fallback import HFModel

        if root is not None:  # transformers reads the shards an index names: confine them as ours
            _weight_files(path, root)
        return HFModel.load(path, dtype, device, root)
    config = read_config(path)
    if moe_impl:
        config.set_moe_impl(moe_impl)
    where = _weight_files(path, root)
    with torch.device("meta"):
        model = model_class(config)(config)
    handles: dict[Path, object] = {}

    def get(name: str) -> torch.Tensor:
        f = where[name]
        try:
            if f not in handles:
                handles[f] = safe_open(f, "pt", device="cpu")
            return handles[f].get_tensor(name)
        except (OSError, SafetensorError) as e:
            raise _damaged(f, e) from None

    names = [n for n, _ in model.named_parameters()]
    state, used = hf_to_native(names, get, lambda n: n in where, config)
    unexpected = sorted(
        k
        for k in where
        if k not in used
        and not IGNORED_HF.search(k)
        and not (k == "lm_head.weight" and config.tie_word_embeddings)
        and not _is_mtp_layer(k, config)
    )
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (f" (+{len(unexpected) - 5} more)" if len(unexpected) > 5 else "")
        raise ModelLoadError(
            f"{path}: {len(unexpected)} tensor(s) the native {config.architecture} model does not use: {shown}",
            hint="the checkpoint does not match its config.json (or uses an unsupported variant)",
        )
    for name, t in state.items():
        want = model.get_parameter(name).shape
        if t.shape != want:
            raise ModelLoadError(
                f"{path}: tensor for {name} has shape {tuple(t.shape)}, config implies {tuple(want)}"
            )
    state = {k: _aligned(v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    config.torch_dtype = str(dtype).removeprefix("torch.")
    if getattr(model, "is_multimodal", False):
        from vf.models.image_processor import processor_for

        model.processor = processor_for(model, path, root)
    return model.eval()


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied when its data is not 16-byte aligned: safetensors only aligns tensors to 8 bytes in
    the file, and a tensor read in place from there can sit at 8 mod 16, which kernels such as
    grouped_mm refuse (the MoE then took its padded path: a Qwen3-VL-MoE training step 3-10x slower)."""
    return t.clone() if t.data_ptr() % 16 else t


def _is_mtp_layer(hf_name: str, config: ModelConfig) -> bool:
    """Multi-token-prediction tensors, which (like transformers) we do not run: under `mtp.` /
    `model.mtp.` ("prefixed": the hybrids, DeepSeek-V4) or as decoder layers appended after the last one
    (`model.[language_model.]layers.{num_hidden_layers + j}.*`, "appended": GLM-4.5, GLM-5, GLM-5.3, DeepSeek-V3)."""
    where = config.family.mtp
    if config.family.ignore_hf and re.search(config.family.ignore_hf, hf_name):
        return True
    if where == "prefixed":
        return bool(re.match(r"(model\.)?mtp\.", hf_name))
    m = re.match(r"model\.(language_model\.)?layers\.(\d+)\.", hf_name)
    return where == "appended" and bool(m) and int(m.group(2)) >= config.num_layers


def write_hf_config(path: Path, config: ModelConfig, dtypes: set[torch.dtype]) -> None:
    """config.json of an HF checkpoint whose tensors have `dtypes` (recorded when there is one)."""
    hf = config.to_hf_dict()
    if len(dtypes) == 1:
        hf["dtype"] = str(next(iter(dtypes))).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")


def save_hf(model: NativeModel, path: str | os.PathLike, max_shard_size: int | None = None) -> Path:
    """Write config.json + safetensors with HF names (sharded with an index when the tensors exceed
    `max_shard_size` bytes). Tied embeddings write no lm_head.weight. An `HFModel` saves itself."""
    path = Path(path)
    if getattr(model, "is_hf_fallback", False):
        return model.save(path, max_shard_size)
    path.mkdir(parents=True, exist_ok=True)
    config = model.config
    tensors = native_to_hf({n: p.detach().cpu() for n, p in model.named_parameters()}, config)
    write_hf_config(path, config, {t.dtype for t in tensors.values()})
    if getattr(model, "processor", None) is not None:  # a VL model's image processor travels with it
        (path / "preprocessor_config.json").write_text(json.dumps(model.processor.to_config(), indent=2) + "\n")
    names = sorted(tensors)
    shards: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = tensors[n].numel() * tensors[n].element_size()
        if max_shard_size and shards[-1] and size + nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += nbytes
    meta = {"format": "pt"}
    for stale in list(path.glob("model*.safetensors")) + [path / INDEX]:
        stale.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file({n: tensors[n] for n in names}, path / SINGLE, metadata=meta)
        return path
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, path / fname, metadata=meta)
        weight_map.update({n: fname for n in shard})
        total += sum(tensors[n].numel() * tensors[n].element_size() for n in shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return path
