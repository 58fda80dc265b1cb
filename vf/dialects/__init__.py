"""The model-API dialects agent programs speak, each parsed into one typed `Call` and answered from
one `vf.types.Response` (see vf.dialects.base):

    chat        OpenAI Chat Completions   POST {base}/chat/completions   Authorization: Bearer KEY
    responses   OpenAI Responses          POST {base}/responses          Authorization: Bearer KEY
    anthropic   Anthropic Messages        POST {base}/messages           x-api-key: KEY (or Bearer)

`{base}` is an endpoint that ends in /v1 (the anthropic SDK and Claude Code add the /v1 themselves:
give them the base without it).
"""

from vf.dialects.anthropic import AnthropicDialect
from vf.dialects.base import Call, Dialect, DialectError
from vf.dialects.chat import ChatDialect
from vf.dialects.responses import ResponsesDialect

DIALECTS: dict[str, Dialect] = {d.name: d for d in (ChatDialect(), ResponsesDialect(), AnthropicDialect())}

__all__ = ["DIALECTS", "AnthropicDialect", "Call", "ChatDialect", "Dialect", "DialectError", "ResponsesDialect"]
