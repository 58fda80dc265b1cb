"""The v1 trace format: round trip, unknown fields, corrupt lines, schema, verifiers compatibility."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from vf.trace import (
    Episode,
    MessageNode,
    ModelCall,
    RewardValue,
    Trace,
    TraceFormatError,
    iter_episodes,
    json_schema,
    read_episodes,
)
from vf.version import TRACE_VERSION, __version__

SCHEMA_FILE = Path(__file__).parent.parent / "vf" / "schemas" / "trace-v1.schema.json"


def make_episode() -> Episode:
    t = Trace()
    t.nodes = [
        MessageNode(message={"role": "user", "content": "hi"}, token_ids=[1, 2], mask=[0, 0]),
        MessageNode(parent=0, message={"role": "assistant", "content": "yo"}, sampled=True,
                    token_ids=[3, 4, 5], mask=[1, 1, 1], logprobs=[-0.1, -0.2, -0.3]),
    ]
    t.calls = [ModelCall(node=1, model="m", usage={"prompt_tokens": 2, "completion_tokens": 3})]
    t.rewards = {"a": RewardValue(score=0.5, weight=2.0), "b": None}
    t.policy = {"start": 3, "end": 4}
    return Episode(traces=[t]).finish()


def test_every_record_carries_version_and_producer():
    raw = json.loads(make_episode().to_json())
    for record in (raw, raw["traces"][0]):
        assert record["version"] == TRACE_VERSION
        assert record["producer"] == {"name": "vf", "version": __version__}


def test_round_trip_and_derived_values():
    ep = make_episode()
    back = Episode.model_validate_json(ep.to_json())
    assert back.to_json() == ep.to_json()
    t = back.traces[0]
    assert t.reward == 1.0  # 0.5 × 2.0; None rewards are skipped
    assert t.num_turns == 1 and t.last_reply == "yo"
    assert back.num_input_tokens == 2 and back.num_output_tokens == 3 and back.num_total_tokens == 5
    assert t.nodes[1].logprobs == [-0.1, -0.2, -0.3] and t.policy == {"start": 3, "end": 4}


def test_unknown_fields_are_kept(tmp_path):
    raw = json.loads(make_episode().to_json())
    raw["future_field"] = {"x": 1}
    raw["traces"][0]["nodes"][1]["routed_experts_summary"] = [1, 2]
    p = tmp_path / "traces.jsonl"
    p.write_text(json.dumps(raw) + "\n")
    (ep,) = read_episodes(p)
    again = json.loads(ep.to_json())
    assert again["future_field"] == {"x": 1}
    assert again["traces"][0]["nodes"][1]["routed_experts_summary"] == [1, 2]


def test_corrupt_lines_are_reported_by_file_and_line(tmp_path):
    p = tmp_path / "traces.jsonl"
    good = make_episode().to_json()
    p.write_text(good + "\n\n" + '{"traces": [{"nodes": "nope"}]}\n' + good[:40] + "\n")
    with pytest.raises(TraceFormatError) as e:
        read_episodes(p)
    assert str(e.value).startswith(f"{p}:3: invalid episode")
    items = list(iter_episodes(p, strict=False))
    assert [(n, type(x).__name__) for n, x in items] == [(1, "Episode"), (3, "TraceFormatError"),
                                                         (4, "TraceFormatError")]
    assert items[2][1].lineno == 4 and "not valid JSON" in items[2][1].reason


def test_bare_trace_line_is_named_as_old_format(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"nodes": [], "rewards": {}}) + "\n")
    with pytest.raises(TraceFormatError, match="vf-migrate"):
        read_episodes(p)


def test_published_schema_is_current():
    assert json.loads(SCHEMA_FILE.read_text()) == json.loads(json.dumps(json_schema(), sort_keys=True))
    schema = json_schema()
    assert {"traces", "task", "version", "producer"} <= set(schema["properties"])
    node = schema["$defs"]["MessageNode"]["properties"]
    assert {"token_ids", "mask", "logprobs"} <= set(node)


VERIFIERS_PY = os.environ.get("VF_VERIFIERS_PYTHON")


@pytest.mark.skipif(not VERIFIERS_PY, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
def test_verifiers_wire_episode_reads_our_lines(tmp_path, stub, cli):
    out = tmp_path / "run"
    cli("vf-eval", "reverse-text", "-m", "reverse", "--base-url", stub.url, "-n", "3", "-o", str(out),
        "--json", check=True)
    code = ("import sys\nfrom verifiers.v1 import WireEpisode\n"
            "for line in open(sys.argv[1]):\n"
            "    ep = WireEpisode.model_validate_json(line)\n"
            "    t = ep.traces[0]\n"
            "    print(t.reward, t.num_turns, len(t.nodes))\n")
    proc = subprocess.run([VERIFIERS_PY, "-c", code, str(out / "traces.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1.0", "1", "3"] * 3
