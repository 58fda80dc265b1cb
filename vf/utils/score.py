"""Reading answers and verdicts out of model text (`vf.extract_boxed_answer`, `vf.parse_judge_choice`).

Both follow verifiers 0.4 (`verifiers.v1.utils.score`) exactly, so a judge ported from it scores a
messy reply the same way: a reasoning model's unfinished `<think>` block is no verdict, the
text after the last `</think>` is what counts, and an explicit "Final verdict: X" line beats a
label mentioned in passing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

BOXED = "\\boxed{"

# A whole "FINAL VERDICT|ANSWER|JUDGMENT [IS] [:|-] X" line (horizontal space only, so the verdict
# must sit on the line it introduces); the last such line wins.
_H = r"[^\S\n]"
_FINAL_LINE = rf"^{_H}*FINAL{_H}+(?:JUDGMENT|ANSWER|VERDICT){_H}*(?:IS{_H}*)?[:\-]?{_H}*"
# The first verdict keyword at the start of the text or of a line; the choice is the first label after it.
_VERDICT_HEAD = re.compile(
    r"(?:^|\n)\s*(?:FINAL\s+JUDGMENT|FINAL\s+ANSWER|FINAL\s+VERDICT|JUDGMENT|VERDICT|ANSWER)\s*(?:IS\s*)?[:\-]?\s*")


def extract_boxed_answer(text: str, strict: bool = False) -> str:
    """The content of the last `\\boxed{...}` (braces balanced); without a closed one: '' if strict,
    else `text`."""
    start = text.rfind(BOXED)
    if start == -1:
        return "" if strict else text
    i, depth = start + len(BOXED), 1
    while i < len(text) and depth > 0:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    if depth != 0:
        return "" if strict else text
    return text[start + len(BOXED):i - 1]


def parse_judge_choice(content: str | None, choices: Sequence[str] = ("A", "B", "C")) -> str | None:
    """Which of `choices` (matched case-insensitively as whole words; returned as given) a judge's
    reply settles on, or None. In order: no text or an unclosed `<think>` → None; only the text
    after the last `</think>` counts; the last "Final verdict/answer/judgment: X" line; else inside
    the last `\\boxed{}` when there is one: the first label after the first verdict keyword
    (None if none follows it), else the last label anywhere."""
    if not content or ("<think>" in content and "</think>" not in content):
        return None
    text = content.rsplit("</think>", 1)[-1].strip()
    by_upper = {choice.upper(): choice for choice in choices}
    label = "(?<!\\w)(" + "|".join(re.escape(c) for c in by_upper) + ")(?!\\w)"

    final_lines = re.findall(_FINAL_LINE + label, text.upper(), re.MULTILINE)
    if final_lines:
        return by_upper.get(final_lines[-1])

    text = extract_boxed_answer(text, strict=True).strip() or text
    upper = text.upper()
    head = _VERDICT_HEAD.search(upper)
    if head is not None:
        after = re.search(label, upper[head.end():])
        return by_upper.get(after.group(1)) if after else None
    anywhere = re.findall(label, upper)
    return by_upper.get(anywhere[-1]) if anywhere else None
