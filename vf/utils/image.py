"""Images in prompts: PIL images become inline data URLs (content parts keep URLs, not pixels)."""

from __future__ import annotations

import base64
from io import BytesIO


def image_data_url(image, format: str = "PNG") -> str:
    """A PIL-compatible image (anything with `.save(buffer, format=...)`) as a base64 data URL."""
    buffer = BytesIO()
    image.save(buffer, format=format)
    return f"data:image/{format.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"
