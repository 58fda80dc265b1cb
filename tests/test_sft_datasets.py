"""SFT on datasets (`vf-train --loss sft --data FILE|DIR|HUB_ID`, trainer/datasets.py): the loss on
assistant tokens only, tool-calling chats in the template's tool format, every file form giving the
same samples, malformed rows refused by file and line, and a run that teaches the tiny model an
answer format."""

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vf.trainer import checkpoint
from vf.trainer.datasets import Loaded, RowError, conversation, is_dataset, load_samples, render

PY = sys.executable
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
WORDS = ["the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "as", "with"]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    from vf.models.tiny import ensure_tiny_model

    return AutoTokenizer.from_pretrained(str(ensure_tiny_model()))


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def trained(tok, s):
    return tok.decode([t for t, m in zip(s.token_ids, s.loss_mask) if m])


# ---- rendering and the assistant mask ------------------------------------------------------------------


def test_loss_mask_covers_exactly_the_assistant_turns(tok):
    row = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
                        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"},
                        {"role": "assistant", "content": "yes ok"}]}
    s = render(tok, *conversation(row, "x"), "x")
    eos = tok.eos_token_id
    # each assistant turn: its content and the end-of-turn token the model must emit (not the newline after)
    expected = encode(tok, "hello") + [eos] + encode(tok, "yes ok") + [eos]
    assert [t for t, m in zip(s.token_ids, s.loss_mask) if m] == expected
    assert s.num_loss_tokens == len(expected) == 8
    assert s.token_ids == encode(tok, tok.apply_chat_template(row["messages"], tokenize=False))
    assert len(s.token_ids) == 53 and s.logprobs == [0.0] * 53


def test_tool_calling_chat_renders_in_the_templates_tool_format(tok):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    row = {"messages": [
        {"role": "user", "content": "weather in paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}], "tools": json.dumps(tools)}  # tools as a JSON string too
    s = render(tok, *conversation(row, "x"), "x")
    text = tok.decode(s.token_ids)
    assert text.startswith("<|im_start|>system\n# Tools\n") and json.dumps(tools[0]) in text  # the schema block
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>'
    assert trained(tok, s) == call + "<|im_end|>" + "It is sunny.<|im_end|>"
    assert "<tool_response>\nsunny\n</tool_response>" in text  # the tool result: context, never trained on
    assert s.num_loss_tokens == len(encode(tok, call)) + 1 + len(encode(tok, "It is sunny.")) + 1


def test_prompt_completion_rows_equal_the_chat_row(tok):
    chat = render(tok, *conversation({"messages": [{"role": "user", "content": "Say the."},
                                                   {"role": "assistant", "content": "ANSWER: the"}]}, "x"), "x")
    for row in ({"prompt": "Say the.", "completion": "ANSWER: the"},
                {"prompt": [{"role": "user", "content": "Say the."}],
                 "completion": [{"role": "assistant", "content": [{"type": "text", "text": "ANSWER: the"}]}]}):
        s = render(tok, *conversation(row, "x"), "x")
        assert (s.token_ids, s.loss_mask) == (chat.token_ids, chat.loss_mask)
    assert trained(tok, chat) == "ANSWER: the<|im_end|>"


ROWS = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"ANSWER: {w}"}]}
        for w in WORDS[:4]]


def test_every_file_form_gives_the_same_samples(tok, tmp_path):
    import datasets

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    as_array = tmp_path / "rows.json"
    as_array.write_text(json.dumps(ROWS))
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds.select([0]), "test": ds}).save_to_disk(str(tmp_path / "splits"))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "train.jsonl").write_text(jsonl.read_text())

    want = load_samples(str(jsonl), tok, 512)
    assert want.rows == 4 and [s.num_loss_tokens for s in want.samples] == [9, 10, 10, 10]  # "ANSWER: w" + eos
    for src in (as_array, tmp_path / "rows.parquet", tmp_path / "saved", tmp_path / "files"):
        got = load_samples(str(src), tok, 512)
        assert [(s.token_ids, s.loss_mask) for s in got.samples] == [(s.token_ids, s.loss_mask) for s in want.samples], src
    assert load_samples(str(tmp_path / "splits"), tok, 512, split="test").rows == 4
    assert load_samples(str(tmp_path / "splits"), tok, 512).rows == 1  # "train" by default
    with pytest.raises(Exception, match="no split 'dev' \\(it has train, test\\)"):
        load_samples(str(tmp_path / "splits"), tok, 512, split="dev")
    # a vf run dir / traces file stays with the traces reader
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "traces.jsonl").write_text('{"version": 1, "traces": []}\n')
    assert not is_dataset(str(tmp_path / "run")) and not is_dataset(str(tmp_path / "run" / "traces.jsonl"))
    assert is_dataset(str(jsonl)) and is_dataset(str(as_array)) and is_dataset("someone/some-dataset")
    with pytest.raises(Exception, match="missing.jsonl: no such file or directory"):  # not a Hub lookup
        load_samples(str(tmp_path / "missing.jsonl"), tok, 512)


def test_rows_past_seq_len_are_cut_or_dropped_and_counted(tok, tmp_path):
    long_prompt = " ".join(WORDS * 4)
    rows = [ROWS[0], {"prompt": long_prompt, "completion": "ok"}, {"prompt": "hi", "completion": long_prompt}]
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_samples(str(f), tok, 24)
    assert (got.rows, len(got.samples), got.truncated, got.dropped) == (3, 2, 2, 1)
    assert all(len(s) <= 25 for s in got.samples) and got.samples[1].info["truncated"]
    assert "3 rows → 2 samples" in got.describe(str(f)) and "1 dropped" in got.describe(str(f))
    assert isinstance(got, Loaded)


@pytest.mark.parametrize("line, expect", [
    ("not json", "line 2: not valid JSON"),
    ('{"text": "plain"}', "line 2: neither a chat row (`messages`) nor a prompt/completion row (keys: text)"),
    ('{"messages": []}', "line 2: `messages` must be a non-empty list of messages"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "line 2: messages[0] has role 'robot'; expected one of"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "line 2: no assistant message, so nothing to train on"),
    ('{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "y"}]}',
     "line 2: messages[0] content must be a string, got int 3"),
    ('{"prompt": "x", "completion": [{"role": "user", "content": "y"}]}',
     "line 2: `completion` holds no assistant message"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": "{bad"}',
     "line 2: `tools` is a string but not JSON"),
])
def test_a_malformed_row_names_the_file_the_line_and_the_problem(tok, tmp_path, line, expect):
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(RowError) as e:
        load_samples(str(f), tok, 512)
    assert f"{f} {expect}" in str(e.value), str(e.value)
    assert e.value.exit_code == 2


# ---- end to end -------------------------------------------------------------------------------------------


def train(*args, timeout=240):
    return subprocess.run([PY, "-m", "vf.commands.train", *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV, check=False)


def greedy(engine, prompts):
    from vf.engines.base import GenerateRequest, Sampling

    async def go():
        return await asyncio.gather(*[engine.generate(GenerateRequest([{"role": "user", "content": p}],
                                                                      Sampling(temperature=0.0, max_tokens=12)))
                                      for p in prompts])

    return asyncio.run(go())


def test_sft_on_a_chat_jsonl_teaches_the_answer_format(tmp_path):
    from vf.models.tiny import _WORDS

    from vf.engines.local import LocalEngine

    words = [w for w in _WORDS if w.isalpha()]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {w}."},
                                                     {"role": "assistant", "content": f"ANSWER: {w}"}]}) + "\n"
                            for w in words[:64]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(data.read_text().splitlines()[0] + "\n" + '{"messages": [{"role": "user"}]}\n')
    proc = train("--loss", "sft", "--data", str(bad), "-o", str(tmp_path / "bad"))
    assert proc.returncode == 2 and f"{bad} line 2: messages[0] (user) has no content" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "bad").exists()

    out = tmp_path / "run"
    proc = train("--loss", "sft", "--data", str(data), "--steps", "30", "--batch-size", "16", "--lr", "3e-3",
                 "--eval.at-start", "false", "--eval.at-end", "false", "--trainer.threads", "1", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--data {data}: 64 rows → 64 samples" in proc.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["sft"] * 30
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
    assert first > 5.5 and last < 1.2, (first, last)  # from ~ln(512) (uniform) to the format learned
    assert all(16 * 9 <= r["num_loss_tokens"] <= 16 * 11 for r in rows)  # 16 rows × "ANSWER: w" + eos: 9-11 tokens

    engine = LocalEngine.from_model("tiny-random", max_batch=8)
    try:
        prompts = [f"Say {w}." for w in ("water", "blue", "the", "people")]  # two held out of the 64
        before = greedy(engine, prompts)
        engine.update_weights(checkpoint.load(checkpoint.latest(out))["model"], 30)
        after = greedy(engine, prompts)
    finally:
        asyncio.run(engine.close())
    fmt = re.compile(r"ANSWER: \w+")
    assert not any(fmt.fullmatch(r.message["content"] or "") for r in before)
    assert all(fmt.fullmatch(r.message["content"] or "") and r.finish_reason == "stop" for r in after), \
        [r.message for r in after]


@pytest.mark.matrix
def test_sft_on_a_dataset_under_two_process_torchrun(tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    torchrun = Path(PY).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "vf.commands.train",
                           "--loss", "sft", "--data", str(data), "--steps", "2", "--batch-size", "4",
                           "--eval.at-start", "false", "--eval.at-end", "false", "-o", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=240, env=ENV, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["num_loss_tokens"] for r in rows] == [39, 39]  # the 4 rows' assistant tokens, over both ranks
