"""SFT samples from a chat dataset (`vf-train --loss sft --data PATH`): rows rendered with the
model's chat template, the loss on the assistant tokens only.

Where the rows come from (`open_rows`):

    FILE.jsonl            one JSON object per line (errors name the line)
    FILE.json             a JSON array of objects (or JSON lines)
    FILE.parquet          read with pyarrow (what `datasets` itself uses)
    DIR                   a `datasets` dir: `Dataset.save_to_disk` output, or a folder of data files
                          (`datasets.load_dataset(DIR)`); `--data.split` picks a split of a DatasetDict
    OWNER/NAME            anything else that is not a local path: a Hub dataset
                          (`datasets.load_dataset(id, --data.subset, split=--data.split)`)

A vf run dir or traces.jsonl is not a dataset (`is_dataset`): those stay with `batches.load_data`.

Row forms (`conversation`):

    chat                  {"messages": [{role, content, tool_calls?, ...}, ...], "tools"?: [...]}
    prompt/completion     {"prompt": str | messages, "completion": str | messages, "tools"?: [...]}

A string prompt is one user message, a string completion one assistant message. `tools` (OpenAI
function schemas, or a JSON string of them) are handed to the template, so a tool-calling chat is
rendered in the model's own tool format (its system block, `<tool_call>` bodies, tool results).

Assistant tokens (`render`): the template is applied to growing prefixes of the conversation and
the token ids diffed. Assistant turn i covers the tokens of render(messages[:i+1]) beyond
render(messages[:i], add_generation_prompt=True), up to and including its end-of-turn token
(what the model must learn to emit to stop; a newline the template writes after it is never
sampled, so it is context). This needs no `{% generation %}` markers in the template (few have
them), and a template that rewrites earlier turns once later ones follow (e.g. one that drops past
reasoning) is caught instead of silently mis-masked: every prefix must be a prefix of the whole
rendering, or the row is refused with a hint to split it.

Samples longer than `trainer.seq_len` + 1 tokens are cut here (as `samples.pack` would) so a row
whose assistant tokens all fall past the cut is dropped, and counted, instead of training on
nothing. Every problem with a row is a UsageError (exit 2) naming the source, the row and what was
expected.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vf.trainer.samples import Sample, truncate

from vf.errors import UsageError

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
ROLES = ("system", "user", "assistant", "tool")
SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")
"""What `Dataset.save_to_disk` / `DatasetDict.save_to_disk` leave in a dir."""


class RowError(UsageError):
    """A malformed dataset row: where it is and what is wrong with it (exit 2)."""


@dataclass
class Loaded:
    samples: list[Sample]
    rows: int
    truncated: int = 0
    dropped: int = 0
    """Rows without an assistant token within seq_len."""

    def describe(self, source: str) -> str:
        extra = [f"{self.truncated} cut at --trainer.seq-len"] if self.truncated else []
        extra += [f"{self.dropped} dropped (no assistant token within --trainer.seq-len)"] if self.dropped else []
        return (f"--data {source}: {self.rows} rows → {len(self.samples)} samples, "
                f"{sum(s.num_loss_tokens for s in self.samples)} loss tokens" + (f" ({', '.join(extra)})" if extra else ""))


# ---- where the rows come from --------------------------------------------------------------------


def is_dataset(path: str) -> bool:
    """Whether `--data path` names a dataset (else a vf run dir or traces file, `batches.load_data`).
    A JSON(L) file is a dataset unless its first row is a vf episode (a `traces` list)."""
    p = Path(path).expanduser()
    if p.is_dir():  # a vf run dir has traces.jsonl, or at least its version.json (vf.rundir)
        return not ((p / "traces.jsonl").exists() or (p / "version.json").exists())
    if not p.exists():
        return True  # a Hub id (or a typo, which the Hub lookup then reports)
    if p.suffix == ".parquet":
        return True
    first = _first_json_row(p)
    return not (isinstance(first, dict) and isinstance(first.get("traces"), list))


def _first_json_row(p: Path) -> Any:
    with open(p, encoding="utf-8", errors="replace") as f:
        head = f.read(1 << 16)
    text = head.lstrip()
    if text.startswith("["):  # a JSON array: the whole file is needed to parse its first element
        try:
            rows = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return rows[0] if isinstance(rows, list) and rows else None
    line = text.split("\n", 1)[0]
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def open_rows(path: str, split: str = "train", subset: str | None = None) -> Iterator[tuple[str, Any]]:
    """(where, row) for every row of the dataset at `path`; `where` names the row in errors."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix == ".parquet":
            yield from _parquet_rows(p)
        elif p.suffix in (".jsonl", ".json"):
            yield from _json_rows(p)
        else:
            raise UsageError(f"--data {path}: a {p.suffix or 'suffix-less'} file is not a dataset this reads",
                             hint=f"pass a {', '.join(FILE_SUFFIXES)} file, a datasets dir, a Hub id or a vf run dir")
    elif p.is_dir():
        yield from _dataset_rows(_load_dir(p, split), str(p))
    elif looks_local(path):  # fail now, not after the Hub client's retries
        raise UsageError(f"--data {path}: no such file or directory",
                         hint="pass a vf run dir, a .jsonl/.json/.parquet file, a datasets dir or a Hub id (OWNER/NAME)")
    else:
        yield from _dataset_rows(_load_hub(path, split, subset), path)


def looks_local(path: str) -> bool:
    """A path no Hub id looks like: absolute, relative with ./ or ~, nested, or a data file's suffix."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or Path(path).suffix in FILE_SUFFIXES


def _json_rows(p: Path) -> Iterator[tuple[str, Any]]:
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--data {p}: not valid JSON ({e})", hint="a .json dataset is one array of objects") from None
        for i, row in enumerate(rows):
            yield f"{p} row {i}", row
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RowError(f"--data {p} line {n}: not valid JSON ({e.msg} at column {e.colno})",
                           hint="a JSONL dataset holds one JSON object per line") from None
        yield f"{p} line {n}", row


def _parquet_rows(p: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # noqa: BLE001 (pyarrow's errors name no common type)
        raise UsageError(f"--data {p}: cannot read it as parquet ({e})", hint="pass a parquet file") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{p} row {i}", row


def _load_dir(p: Path, split: str):
    import datasets

    try:
        if any((p / f).exists() for f in SAVED_DATASET_FILES):
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(str(p))
    except Exception as e:  # noqa: BLE001 (datasets raises many types for a dir it cannot read)
        raise UsageError(f"--data {p}: not a datasets dir ({type(e).__name__}: {e})",
                         hint="pass a dir written by Dataset.save_to_disk, a folder of .jsonl/.json/.parquet "
                              "files, or a vf run dir (traces.jsonl)") from None
    return _pick_split(ds, split, str(p))


def _load_hub(name: str, split: str, subset: str | None):
    import datasets

    try:
        ds = datasets.load_dataset(name, subset, split=split)
    except Exception as e:  # noqa: BLE001 (network, auth, unknown repo, unknown split)
        raise UsageError(f"--data {name}: no such local path, and loading it as a Hub dataset failed "
                         f"({type(e).__name__}: {e})",
                         hint="check the path, or the Hub id, --data.split and --data.subset (and the network)") from None
    return _pick_split(ds, split, name)


def _pick_split(ds, split: str, source: str):
    if hasattr(ds, "keys") and not hasattr(ds, "features"):  # a DatasetDict
        if split not in ds:
            raise UsageError(f"--data {source}: no split {split!r} (it has {', '.join(ds.keys())})",
                             hint="pick one with --data.split NAME")
        return ds[split]
    return ds


def _dataset_rows(ds, source: str) -> Iterator[tuple[str, Any]]:
    for i, row in enumerate(ds):
        yield f"{source} row {i}", row


# ---- rows → conversations ---------------------------------------------------------------------------


def conversation(row: Any, where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of a chat or prompt/completion row; RowError when it is neither."""
    if not isinstance(row, dict):
        raise RowError(f"{where}: a row must be an object, got {type(row).__name__}", hint=FORMS_HINT)
    tools = _tools(row.get("tools"), where)
    if row.get("messages") is not None:
        messages = _messages(row["messages"], where, "messages")
    elif "prompt" in row and "completion" in row:
        prompt = _side(row["prompt"], "user", where, "prompt")
        completion = _side(row["completion"], "assistant", where, "completion")
        if not any(m["role"] == "assistant" for m in completion):
            raise RowError(f"{where}: `completion` holds no assistant message", hint=FORMS_HINT)
        messages = prompt + completion
    else:
        keys = ", ".join(sorted(map(str, row))) or "none"
        raise RowError(f"{where}: neither a chat row (`messages`) nor a prompt/completion row (keys: {keys})",
                       hint=FORMS_HINT)
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError(f"{where}: no assistant message, so nothing to train on", hint=FORMS_HINT)
    if messages[0]["role"] == "assistant":  # its prompt would be the template's bare preamble
        raise RowError(f"{where}: the conversation starts with an assistant message",
                       hint="start it with a system or user message (the prompt the reply answers)")
    return messages, tools


FORMS_HINT = ('each row is {"messages": [{"role": ..., "content": ...}, ...]} (optionally "tools": [...]) '
              'or {"prompt": str | messages, "completion": str | messages}')


def _side(value: Any, role: str, where: str, key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return _messages(value, where, key)


def _messages(value: Any, where: str, key: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise RowError(f"{where}: `{key}` must be a non-empty list of messages, got {_show(value)}", hint=FORMS_HINT)
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            raise RowError(f"{where}: {key}[{j}] must be an object with a role and content, got {_show(m)}",
                           hint=FORMS_HINT)
        role = m.get("role")
        if role not in ROLES:
            raise RowError(f"{where}: {key}[{j}] has role {role!r}; expected one of {', '.join(ROLES)}",
                           hint=FORMS_HINT)
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: text only
            if not all(isinstance(p, dict) and p.get("type", "text") == "text" for p in content):
                raise RowError(f"{where}: {key}[{j}] has non-text content parts; SFT on a dataset reads text only",
                               hint="keep text parts ({'type': 'text', 'text': ...}) or a string")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise RowError(f"{where}: {key}[{j}] ({role}) has no content", hint=FORMS_HINT)
        if content is not None and not isinstance(content, str):
            raise RowError(f"{where}: {key}[{j}] content must be a string, got {_show(content)}", hint=FORMS_HINT)
        calls = m.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list)):
            raise RowError(f"{where}: {key}[{j}] tool_calls must be a list on an assistant message", hint=FORMS_HINT)
        # Arrow fills keys other rows have with None: drop them so the template sees them undefined
        out.append({**{k: v for k, v in m.items() if v is not None}, "role": role, "content": content})
    return out


def _tools(value: Any, where: str) -> list[dict[str, Any]] | None:
    if value is None or value == [] or value == "":
        return None
    if isinstance(value, str):  # some datasets keep the schemas as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"{where}: `tools` is a string but not JSON ({e.msg})",
                           hint="give tools as a list of function schemas") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RowError(f"{where}: `tools` must be a list of function schemas, got {_show(value)}",
                       hint='e.g. [{"type": "function", "function": {"name": ..., "parameters": {...}}}]')
    return value


def _show(v: Any) -> str:
    return f"{type(v).__name__} {json.dumps(v, default=str)[:80]}"


# ---- conversations → samples ----------------------------------------------------------------------


def render(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, where: str) -> Sample:
    """The conversation's tokens with the loss on its assistant turns (see the module docstring)."""
    eos = tokenizer.eos_token_id

    def ids(msgs, gen: bool) -> list[int]:
        try:
            text = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)
        except Exception as e:  # noqa: BLE001 (a template error is the row's fault: roles, order, fields)
            raise RowError(f"{where}: the chat template rejected the conversation ({type(e).__name__}: {e})",
                           hint="check the roles and their order (system first, tool results after a tool call)") from None
        return list(tokenizer.encode(text, add_special_tokens=False))

    full = ids(messages, False)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, upto = ids(messages[:i], True), ids(messages[:i + 1], False)
        if upto[:len(before)] != before or full[:len(upto)] != upto:
            raise RowError(f"{where}: the chat template renders assistant turn {i} differently once later "
                           "messages follow (it rewrites earlier turns), so its tokens cannot be located",
                           hint="split the conversation into one prompt/completion row per assistant turn")
        span = range(len(before), len(upto))
        last_eos = max((t for t in span if full[t] == eos), default=None)
        for t in span:
            if last_eos is None or t <= last_eos:
                mask[t] = 1
    return Sample(full, mask, [0.0] * len(full), info={"row": where})


def load_samples(path: str, tokenizer, seq_len: int, split: str = "train", subset: str | None = None) -> Loaded:
    """Every row of the dataset at `path` as a Sample (cut to seq_len + 1 tokens)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"--data {path}: the model's tokenizer has no chat template to render the rows with",
                         hint="train a model whose tokenizer_config.json has a chat_template")
    out = Loaded([], 0)
    for where, row in open_rows(path, split, subset):
        out.rows += 1
        messages, tools = conversation(row, where)
        s = render(tokenizer, messages, tools, where)
        if len(s) > seq_len + 1:
            s, out.truncated = truncate(s, seq_len + 1), out.truncated + 1
        if s.num_loss_tokens == 0:
            out.dropped += 1
            continue
        out.samples.append(s)
    if not out.rows:
        raise UsageError(f"--data {path}: no rows", hint="the dataset (split --data.split) is empty")
    if not out.samples:
        raise UsageError(f"--data {path}: no row has an assistant token within --trainer.seq-len {seq_len}",
                         hint="raise --trainer.seq-len")
    return out
