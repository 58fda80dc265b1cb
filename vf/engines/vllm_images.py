"""Image prompts for the vLLM engine: what vLLM 0.32's token-in route gets for a prompt with image_url parts.

    spec = ImageSpec.from_dir(model_dir)           # None for a checkpoint without an image processor
    req = image_request(tokenizer, spec, messages, tools, roots)
    req.token_ids       # the rendered prompt: one placeholder token per image (vLLM expands them)
    req.expanded_ids    # the same with each image's tokens in place, exactly as the trainer expands them
    req.content_parts   # [{"type": "image_url", "url": data URL}, ...] in placeholder order
    check_expansion(req, prompt_token_ids_vllm_returned)

`/inference/v1/generate` takes `content_parts` beside `token_ids` (vLLM resolves each image, runs the
model's HF processor and replaces each placeholder token by that image's tokens) and, with
`return_token_ids`, answers the expanded prompt. The expansion is also computed here with the
trainer's own image processor (`vf.models.image_processor`, torch-free), and vLLM's must equal it:
the trace then holds prompt ids the trainer feeds its model with the same images, and a processor
that disagrees (another resize rule) is an error rather than log-probs of a different prompt.

Every image is decoded here before anything is sent, so an image that does not decode fails its
episode naming its message. Data URLs are sent as they are; a local file (read only under `roots`,
as the embedded engine reads them) is sent as a data URL of its bytes: the server reads no local
files, and one on another machine could not.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vf.engines.chat import expand_image_tokens, image_refs, render_prompt
from vf.errors import EngineError
from vf.models.image_processor import ImageProcessor, load_image


@dataclass
class ImageSpec:
    """What a VL checkpoint's prompts need, read from its directory without loading the model."""

    processor: ImageProcessor
    image_token_id: int
    merge: int

    def tokens(self, width: int, height: int) -> int:
        """Placeholder tokens of one image: t*h*w / merge², as `vf.models.vision.merged_tokens`
        (not imported: it would import torch into every vLLM-engine client)."""
        t, h, w = self.processor.grid(width, height)
        return t * h * w // (self.merge * self.merge)

    @classmethod
    def from_dir(cls, path: str | Path) -> ImageSpec | None:
        path = Path(path)
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        token = config.get("image_token_id")
        processor = ImageProcessor.from_dir(path)
        if token is None or processor is None:
            return None
        merge = (config.get("vision_config") or {}).get("spatial_merge_size", processor.merge_size)
        return cls(processor, int(token), int(merge))


@dataclass
class ImageRequest:
    token_ids: list[int]
    expanded_ids: list[int]
    content_parts: list[dict[str, Any]]
    refs: list[str]


def _where(messages: list[dict[str, Any]]) -> list[int]:
    """The message index of each image, in prompt order."""
    return [i for i, m in enumerate(messages) for _ in image_refs([m])]


def data_url(ref: str, roots) -> str:
    """`ref` as a data URL: as it is when it is one, else the bytes of the local file it names
    (under `roots`; `load_image` has already checked that it is there and decodes)."""
    if ref.startswith("data:"):
        return ref
    path = Path(ref.removeprefix("file://")).expanduser().resolve()
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def _mismatch(tokenizer, spec: ImageSpec, messages, tools) -> int:
    """The first message after which the rendered placeholders and the images differ in number."""
    for j in range(len(messages)):
        try:
            shown = render_prompt(tokenizer, messages[: j + 1], tools, images=True).count(spec.image_token_id)
        except EngineError:
            continue  # a prefix the template does not accept alone
        if shown != len(image_refs(messages[: j + 1])):
            return j
    return len(messages) - 1


def image_request(tokenizer, spec: ImageSpec, messages: list[dict[str, Any]], tools=None, roots=()) -> ImageRequest:
    ids = render_prompt(tokenizer, messages, tools, images=True)
    refs = image_refs(messages)
    where = _where(messages)
    counts, parts = [], []
    for k, (ref, m) in enumerate(zip(refs, where)):
        try:
            image = load_image(ref, roots)
            counts.append(spec.tokens(*image.size))
            parts.append({"type": "image_url", "url": data_url(ref, roots)})
        except EngineError as e:
            raise EngineError(f"message {m}, image {k}: {e.message}", type=e.type, status_code=400) from None
    placeholders = ids.count(spec.image_token_id)
    if placeholders != len(refs):
        # every episode of this model would repeat it (its chat template drops image parts), or the
        # text itself holds the placeholder token: UnsupportedContent stops the run (exit 2)
        j = _mismatch(tokenizer, spec, messages, tools)
        raise EngineError(f"message {j}: the prompt shows {placeholders} image placeholder(s) for {len(refs)} image(s); "
                          "the chat template must write one placeholder per image_url part, and text must not "
                          "contain the placeholder token", type="UnsupportedContent", status_code=400)
    return ImageRequest(ids, expand_image_tokens(ids, spec.image_token_id, counts), parts, refs)


def check_expansion(req: ImageRequest, returned: list[int] | None) -> None:
    """vLLM's expanded prompt must be the trainer's (see the module docstring)."""
    if returned is None:
        raise EngineError("the vLLM server returned no prompt token ids for an image prompt (return_token_ids)",
                          type="ProviderError")
    if list(returned) != req.expanded_ids:
        at = next((i for i, (a, b) in enumerate(zip(returned, req.expanded_ids)) if a != b),
                  min(len(returned), len(req.expanded_ids)))
        raise EngineError(f"vLLM expanded the image prompt to {len(returned)} tokens, the trainer's image processor to "
                          f"{len(req.expanded_ids)} (first difference at token {at}): their image processors disagree "
                          "on the image's size", type="ProviderError")
