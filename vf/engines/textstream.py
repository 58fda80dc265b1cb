"""Which part of a reply still being decoded an agent may already be shown.

A streamed reply must add up to exactly what the finished reply carries (`LocalEngine.build_message`:
text cut before the stop string that ended it, `<tool_call>` blocks moved into tool calls and the
rest stripped when there are any). So, of the text decoded so far, only a prefix that no later token
can take back is safe:

- nothing from a stop string or a `<tool_call>` marker on, nor the last characters when they may
  be the start of one (held back until the next token decides);
- no trailing whitespace (stripped if a tool call follows) and no half-decoded character (U+FFFD);
- nothing at all when the reply starts with whitespace: whether it stays depends on whether a tool
  call comes later, so such a reply is shown whole when it ends.

`ReplyText` (per token) and `visible` (per text) are the one copy of these rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

TOOL_CALL_MARKER = "<tool_call>"


def visible(text: str, stops: Sequence[str], final: bool = False, tool_calls: bool = True) -> str:
    """The part of decoded `text` that is safe to show (see module docstring); `final`: the reply
    has ended (nothing held back for what the next token might be); `tool_calls` False: the text
    is never parsed for tool calls (vf-serve without `tools`), so their marker is plain text."""
    for s in stops:
        cut = text.find(s)
        if cut >= 0:
            text, final = text[:cut], True
    markers = [*stops, TOOL_CALL_MARKER] if tool_calls else list(stops)
    cut = text.find(TOOL_CALL_MARKER) if tool_calls else -1
    if cut >= 0:
        text = text[:cut]
    elif not final:
        text = text[: len(text) - held(text, markers)]
    return text.removesuffix("\ufffd")


def held(text: str, markers: Sequence[str]) -> int:
    """How many of `text`'s last characters may be the start of one of `markers` (wait for more)."""
    longest = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:k]):
                longest = k
                break
    return longest


class ReplyText:
    """Token ids in, text deltas out: each `push` answers what may be shown now that was not before."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.decode(self.ids)
        if text[:1].isspace():
            return ""
        safe = visible(text, self.stops).rstrip()
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""  # nothing new, or a re-decode changed what came before: wait
        delta, self.sent = safe[len(self.sent):], safe
        return delta
