"""The built-in tiny Qwen3 models + byte-level BPE tokenizer, offline and deterministic.

Built-in model names (`builtin_model_path(name)`; every command that takes a model accepts them):
    tiny          the trained model shipped in the package (models/tiny_trained/, ~2 MB): the
                  random one after vf-train's SFT warm-up + IPO on reverse-text; rebuilt by
                  `python -m vf.models.build_tiny` (see that module for the recipe)
    tiny-agent    the trained agent model (models/tiny_agent_trained/): an 8192-token context and
                  a code tokenizer, SFT on gold bash-harness trajectories then IPO on swe-gen;
                  rebuilt by `python -m vf.models.build_agent` (its shapes and recipe live there)
    tiny-random   the random-init model, built on first use:
    ensure_tiny_model(path=None) -> Path   # an HF directory: config.json, model.safetensors,
                                           # tokenizer.json, tokenizer_config.json, generation_config.json
Default location: $VF_CACHE_DIR/tiny-qwen3-<hash> (else ~/.cache/vf/tiny-qwen3-<hash>); the hash
covers everything that determines the bytes, so a changed recipe builds a new directory. The build
writes into a temp dir and renames it into place (safe against concurrent builders).

Model shapes: V≈512 vocab, H=128, 2 layers, 4 query heads / 2 kv heads, hd=32, I=384, tied embeddings.
Importing this module does not import torch; ensure_tiny_model imports it when it has to build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

TINY_VERSION = 1
SEED = 1234
VOCAB_SIZE = 512
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # special=True (skipped by skip_special_tokens)
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
MODEL = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "max_position_embeddings": 2048,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}

CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'user' or message.role == 'system' %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.reasoning_content %}{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}{%- endif %}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if loop.first and not message.content %}{{- '<tool_call>\n' }}{%- else %}{{- '\n<tool_call>\n' }}{%- endif %}
{{- '{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "I",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "answer",
    "question",
    "reverse",
    "reversed",
    "text",
    "letter",
    "letters",
    "count",
    "sum",
    "add",
    "total",
    "result",
    "final",
    "step",
    "think",
    "solve",
    "problem",
    "because",
    "therefore",
    "yes",
    "true",
    "false",
    "correct",
    "wrong",
    "please",
    "user",
    "assistant",
    "system",
    "tool",
    "function",
    "name",
    "arguments",
    "string",
    "list",
    "value",
    "return",
    "output",
    "input",
    "example",
    "let",
    "us",
    "first",
    "second",
    "third",
    "hello",
    "world",
    "thanks",
    "sorry",
    "here",
    "is",
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "hundred",
    "thousand",
    "plus",
    "minus",
    "times",
    "divided",
    "equals",
]
_PIECES = [
    "<reversed_text>",
    "</reversed_text>",
    "<answer>",
    "</answer>",
    "\\boxed{",
    "\\boxed{42}",
    "\\frac{1}{2}",
    "12+7=19",
    "3*4=12",
    "100-58=42",
    "2^10=1024",
    "x = 5",
    "f(x)",
    '{"name": "',
    '", "arguments": {',
    '"a": 1, "b": 2}',
    "Answer:",
    "Question:",
    "Let's think step by step.",
    "The answer is",
    "e.g.",
    "i.e.",
    "(a)",
    "[1, 2, 3]",
    "http://",
    "def f():",
    "    return x",
    "#",
    "##",
    "**",
    "...",
    "?!",
    "—",
    "héllo ✓",
]


def corpus() -> list[str]:
    """Deterministic in-memory training text (letters, digits, words, punctuation, task markup)."""
    lines = []
    alpha = "abcdefghijklmnopqrstuvwxyz"
    lines += [
        alpha,
        alpha.upper(),
        "0123456789",
        " ".join(alpha),
        " ".join(alpha.upper()),
        " ".join("0123456789"),
    ]
    lines += [" ".join(str(i) for i in range(n, n + 20)) for n in range(0, 200, 20)]
    lines += ["!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ \n\t"]
    for rep in range(3):
        for i in range(0, len(_WORDS), 8):
            chunk = _WORDS[i : i + 8]
            lines.append(
                " ".join(chunk) + (". " if rep == 0 else ", ") + " ".join(w.capitalize() for w in chunk) + "?"
            )
    lines += _PIECES * 3
    lines += [f"<reversed_text>{w[::-1]}</reversed_text> {w}" for w in _WORDS[:60]]
    lines += [f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}" for a, b in zip(range(3, 90, 7), range(11, 200, 13))]
    return lines


def _recipe() -> dict:
    return {
        "version": TINY_VERSION,
        "seed": SEED,
        "vocab": VOCAB_SIZE,
        "special": SPECIAL,
        "added": ADDED,
        "model": MODEL,
        "template": CHAT_TEMPLATE,
        "corpus": corpus(),
    }


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(_recipe(), sort_keys=True).encode()).hexdigest()[:12]


def default_path() -> Path:
    root = os.environ.get("VF_CACHE_DIR") or Path.home() / ".cache" / "vf"
    return Path(root) / f"tiny-qwen3-{recipe_hash()}"


TRAINED_PATH = Path(__file__).parent / "tiny_trained"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
AGENT_TRAINED_PATH = Path(__file__).parent / "tiny_agent_trained"
BUILTIN_MODELS = ("tiny", "tiny-random", "tiny-vl", "tiny-agent")


def builtin_model_path(name: str | os.PathLike | None) -> Path | None:
    """The HF directory of a built-in model name ('tiny', 'tiny-random'; None means 'tiny'),
    or None when `name` is not one (then it is a path or a server's model name)."""
    if name is None or str(name) == "tiny":
        if not _complete(TRAINED_PATH):
            from vf.errors import UsageError

            raise UsageError(f"the trained built-in model is missing from {TRAINED_PATH}",
                             hint="rebuild it with `python -m vf.models.build_tiny`, or use -m tiny-random")
        return TRAINED_PATH
    if str(name) == "tiny-random":
        return ensure_tiny_model()
    if str(name) == "tiny-agent":
        if not _complete(AGENT_TRAINED_PATH):
            from vf.errors import UsageError

            raise UsageError(f"the built-in agent model is missing from {AGENT_TRAINED_PATH}",
                             hint="rebuild it with `python -m vf.models.build_agent`")
        return AGENT_TRAINED_PATH
    if str(name) == "tiny-vl":  # the random-init vision-language model (vf.models.tiny_vl)
        from vf.models.tiny_vl import ensure_tiny_vl_model

        return ensure_tiny_vl_model()
    return None


def _complete(path: Path) -> bool:
    need = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    return all((path / f).is_file() for f in need)


def ensure_tiny_model(path: str | os.PathLike | None = None) -> Path:
    """Return a directory holding the tiny model, building it first if absent (offline, < 1 s + imports)."""
    path = Path(path) if path is not None else default_path()
    return build_once(path, build_into, _complete)


def build_once(path: Path, build, complete) -> Path:
    """`path`, after `build(tmp_dir)` wrote it into a temp dir renamed into place, unless
    `complete(path)` already holds (safe against concurrent builders)."""
    if complete(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        try:
            os.rename(tmp, path)
        except OSError:
            if not complete(path):  # an empty/partial dir is in the way: replace it
                shutil.rmtree(path, ignore_errors=True)
                os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def build_tokenizer(lines: list[str] | None = None, vocab_size: int = VOCAB_SIZE):
    """The byte-level BPE tokenizer, trained on `lines` (default: `corpus()`)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED),
        special_tokens=SPECIAL,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus() if lines is None else lines, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return tok


def build_into(out: Path, model: dict | None = None, lines: list[str] | None = None,
               vocab_size: int = VOCAB_SIZE) -> None:
    """Write the tokenizer and model files into `out` (deterministic bytes). The defaults build
    `tiny-random`; other shapes / tokenizer corpora build other random-init bases (build_agent)."""
    from vf.models.config import ModelConfig

    model = MODEL if model is None else model
    tok = build_tokenizer(lines, vocab_size)
    ids = {t: tok.token_to_id(t) for t in SPECIAL + ADDED}
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
        for t in SPECIAL + ADDED
    }
    tok_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    _write_json(out / "tokenizer_config.json", tok_cfg)
    _write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    _write_json(out / "generation_config.json", {"eos_token_id": eos, "pad_token_id": pad, "do_sample": True})

    from vf.models.checkpoint import save_hf
    from vf.models.transformer import build_model

    config = ModelConfig(
        architecture="qwen3",
        vocab_size=tok.get_vocab_size(),
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        **model,
    )
    model = build_model(config, seed=SEED)
    save_hf(model, out)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
