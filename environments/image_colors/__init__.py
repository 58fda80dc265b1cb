"""image-colors: name the colour of the shape in a small generated image (a multimodal taskset).

Each prompt is one user message with a text part and an image part: a `size`×`size` PNG, inline as
a data URL, with one filled square or circle in one of `colors` (its shade jittered) on a light
background. Reward 1 when the reply's first word is the colour. Data is generated offline from a
seed with Pillow; a model must read images (e.g. `-m tiny-vl`); a text-only model refuses it.
"""

from __future__ import annotations

import random
import re

from pydantic import Field

import vf
from vf.errors import UsageError
from vf.utils.image import image_data_url

PALETTE = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (30, 60, 220), "yellow": (235, 210, 30),
           "black": (20, 20, 20), "purple": (140, 40, 170)}
QUESTION = "What colour is the shape? Answer with one word."
WORD = re.compile(r"[a-z]+")


def parse_answer(reply: str) -> str:
    m = WORD.search(reply.lower())
    return m.group(0) if m else ""


def draw(color: str, rng: random.Random, size: int = 32):
    """A light background with one filled square or circle of `color` (each channel jittered ±20)."""
    from PIL import Image, ImageDraw

    bg = tuple(rng.randint(225, 255) for _ in range(3))
    image = Image.new("RGB", (size, size), bg)
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in PALETTE[color])
    side = rng.randint(size // 3, size * 2 // 3)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    shape = ImageDraw.Draw(image).ellipse if rng.random() < 0.5 else ImageDraw.Draw(image).rectangle
    shape((x, y, x + side - 1, y + side - 1), fill=fill)
    return image


class ColorData(vf.TaskData):
    answer: str
    """The shape's colour name."""


class ColorConfig(vf.TasksetConfig):
    size: int = 200
    """Number of tasks."""
    seed: int = 0
    colors: list[str] = Field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    """Colour names to draw from (any of: red, green, blue, yellow, black, purple)."""
    image_size: int = 32
    """Image side in pixels."""


class ColorTask(vf.Task[ColorData, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def correct(self, task, trace) -> float:
        return float(parse_answer(trace.last_reply) == task.answer)

    def validate(self) -> str:
        return self.data.answer


class ImageColorsTaskset(vf.Taskset[ColorTask, ColorConfig]):
    def load(self):
        unknown = sorted(set(self.config.colors) - set(PALETTE))
        if unknown or not self.config.colors:
            raise UsageError(f"unknown colours {unknown}" if unknown else "colors must not be empty",
                                hint=f"choose from {', '.join(PALETTE)}")
        rng = random.Random(self.config.seed)
        for i in range(self.config.size):
            color = rng.choice(self.config.colors)
            url = image_data_url(draw(color, rng, self.config.image_size))
            prompt = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                   {"type": "image_url", "image_url": {"url": url}}]}]
            yield ColorData(id=f"image-colors-{self.config.seed}-{i}", prompt=prompt, answer=color)


__all__ = ["ImageColorsTaskset"]
