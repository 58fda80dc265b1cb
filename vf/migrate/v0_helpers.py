"""The v0 helper library that environments import besides the core classes, as plain vf code.

verifiers 0.4 removed the v0 implementation, so `from verifiers.utils.data_utils import ...`
runs nowhere. `vf-migrate` rewrites those imports to `vf.migrate.compat`, which re-exports
this module:

- data helpers of `verifiers.utils.data_utils`: `load_example_dataset` (its named datasets and
  their column preprocessing), `extract_boxed_answer`, `extract_hash_answer`,
  `strip_non_numeric`, `BOXED_SYSTEM_PROMPT`, `THINK_BOXED_SYSTEM_PROMPT`;
- `load_dataset`: `datasets.load_dataset`, except that when `VF_DATA_DIR` is set, a local
  JSON-lines file stands in for a hub dataset (tests and air-gapped machines; see `local_file`);
- `math_answers_equal`: the check v0's MathRubric ran (math_verify when installed);
- `python`: the `verifiers.utils.tools.python` tool.

Each copies v0 0.1.x behaviour, so a migrated reward gives v0's number.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vf.utils.score import extract_boxed_answer  # v0 data_utils helper, re-exported here

THINK_BOXED_SYSTEM_PROMPT = "Think step-by-step inside <think>...</think> tags. \
    Then, give your final answer inside \\boxed{}."
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

DATA_DIR_ENV = "VF_DATA_DIR"


# ---- answer extraction ------------------------------------------------------------------------


def strip_non_numeric(text: str) -> str:
    return "".join(c for c in text if c.isdigit() or c == ".")


def extract_hash_answer(text: str) -> str:
    """GSM8K's answer after `####` (the whole text when there is none)."""
    return text.split("####")[1].strip() if "####" in text else text


# ---- datasets: the hub, or local files ---------------------------------------------------------


def local_file(path: str, name: str | None = None, split: str | None = None) -> Path | None:
    """The local stand-in for hub dataset `path` (config `name`, `split`) under `$VF_DATA_DIR`.

    Looked up, most specific first: `<org>__<dataset>[.<name>][.<split>].jsonl` (`/` in the hub
    id becomes `__`). None when `VF_DATA_DIR` is unset or holds no such file."""
    root = os.environ.get(DATA_DIR_ENV)
    if not root:
        return None
    stem = path.replace("/", "__")
    names = [f"{stem}.{name}.{split}", f"{stem}.{name}"] if name else []
    names += [f"{stem}.{split}", stem] if split else [stem]
    for n in names:
        f = Path(root) / f"{n}.jsonl"
        if f.is_file():
            return f
    return None


def load_dataset(path: str, name: str | None = None, *, split: str | None = None, **kwargs: Any) -> Any:
    """`datasets.load_dataset`, or the rows of `local_file(...)` when `$VF_DATA_DIR` has one (a
    `Dataset` for a split, a `DatasetDict` holding it as `split`/"train"/"test" otherwise)."""
    import datasets

    f = local_file(path, name, split)
    if f is None:
        return datasets.load_dataset(path, name, split=split, **kwargs)
    ds = datasets.Dataset.from_json(str(f))
    if split is not None:
        return ds
    return datasets.DatasetDict({s: ds for s in ("train", "test", "validation", "dev")})


def _preprocess(name: str) -> Callable[[dict], dict]:
    """v0's per-dataset row mapping to `question` / `answer`."""
    if name == "aime2024":
        return lambda x: {"question": x["problem"], "answer": str(int(x["answer"]))}
    if name == "aime2025":
        return lambda x: {"question": x["question"], "answer": strip_non_numeric(x["answer"])}
    if name in ("amc2023", "math500", "openrs", "openrs_easy", "openrs_hard"):
        return lambda x: {"question": x["problem"], "answer": x["answer"]}
    if name in ("gpqa_diamond", "gpqa_main"):
        def gpqa(x: dict) -> dict:
            letters = ["A", "B", "C", "D"]
            random.shuffle(letters)
            ans = {letters[0]: x["Correct Answer"], letters[1]: x["Incorrect Answer 1"],
                   letters[2]: x["Incorrect Answer 2"], letters[3]: x["Incorrect Answer 3"]}
            question = f"Question: {x['Question']}\n\n" + "\n".join(f"{k}: {ans[k]}" for k in "ABCD")
            return {"question": question, "answer": letters[0]}
        return gpqa
    if name == "gsm8k":
        return lambda x: {"question": x["question"], "answer": extract_hash_answer(x["answer"])}
    if name == "math":
        return lambda x: {"question": x["problem"], "answer": extract_boxed_answer(x["solution"])}
    if name == "mmlu":
        return lambda x: {"question": f"Question: {x['question']}\n" + "".join(
            f"\n{'ABCD'[i]}: {o}" for i, o in enumerate(x["choices"])), "answer": "ABCD"[x["answer"]]}
    if name == "mmlu_pro":
        return lambda x: {"question": f"Question: {x['question']}\n" + "".join(
            f"\n{'ABCDEFGHIJ'[i]}: {o}" for i, o in enumerate(x["options"])), "answer": x["answer"]}
    if name == "openbookqa":
        return lambda x: {"question": f"Question: {x['question_stem']}\n\nChoices:\n" + "\n".join(
            f"{lab}. {t}" for lab, t in zip(x["choices"]["label"], x["choices"]["text"])), "answer": x["answerKey"]}
    if name == "prime_code":
        return lambda x: {"question": x["prompt"], "answer": x["verification_info"]}
    raise ValueError(f"Dataset {name} not supported for preprocess_dataset.")


# name → (hub id, config, default split): v0's load_example_dataset table.
EXAMPLE_DATASETS: dict[str, tuple[str, str | None, str]] = {
    "aime2024": ("HuggingFaceH4/aime_2024", None, "train"),
    "aime2025": ("opencompass/AIME2025", None, "test"),
    "amc2023": ("knoveleng/AMC-23", None, "train"),
    "gpqa_diamond": ("Idavidrein/gpqa", "gpqa_diamond", "train"),
    "gpqa_main": ("Idavidrein/gpqa", "gpqa_main", "train"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "math": ("chiayewken/competition_math", None, "train"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "mmlu": ("cais/mmlu", "all", "dev"),
    "mmlu_pro": ("TIGER-Lab/MMLU-Pro", None, "validation"),
    "openbookqa": ("allenai/openbookqa", "main", "train"),
    "openrs": ("knoveleng/open-rs", None, "train"),
    "openrs_easy": ("knoveleng/open-rs", None, "train"),
    "openrs_hard": ("knoveleng/open-rs", None, "train"),
    "prime_code": ("PrimeIntellect/verifiable-coding-problems", None, "train"),
}


def load_example_dataset(name: str = "gsm8k", split: str | None = None, n: int | None = None, seed: int = 0) -> Any:
    """v0's named example datasets with `question`/`answer` columns (through `load_dataset`, so
    `$VF_DATA_DIR` can hold the raw hub rows: e.g. `openai__gsm8k.main.test.jsonl`)."""
    import datasets

    if name not in EXAMPLE_DATASETS:
        raise ValueError(f"Dataset {name} not supported for preprocess_dataset. \nPlease ensure that the dataset "
                         "is formatted with 'prompt' (str) and 'answer' (str) keys.")
    hub, config, default_split = EXAMPLE_DATASETS[name]
    split = split or default_split
    if name == "aime2025":
        ds = datasets.concatenate_datasets([load_dataset(hub, part, split=split) for part in ("AIME2025-I", "AIME2025-II")])
    else:
        ds = load_dataset(hub, config, split=split)
    if name in ("openrs_easy", "openrs_hard"):
        level = "Easy" if name == "openrs_easy" else "Hard"
        ds = ds.filter(lambda x: x["level"] == level)
    if name == "prime_code":
        ds = ds.filter(lambda x: x["prompt"].startswith(
            "Solve the following coding problem using the programming language python:"))
    if n is not None and n > 0:
        ds = ds.shuffle(seed=seed).select(range(n))
    return ds.map(_preprocess(name), remove_columns=ds.column_names)


# ---- math grading ------------------------------------------------------------------------------


def _normalise(expr: str) -> str:
    expr = expr.strip().strip("$").replace("\\left", "").replace("\\right", "").replace("\\!", "")
    expr = expr.replace("dfrac", "frac").replace("tfrac", "frac").replace(" ", "").rstrip(".")
    expr = re.sub(r"\\text\{(.*?)\}", r"\1", expr)
    return expr


def _number(expr: str) -> float | None:
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}", expr)
    try:
        if m:
            return int(m.group(1)) / int(m.group(2))
        return float(expr.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def math_answers_equal(response: str, answer: str, timeout_seconds: int = 5) -> float:
    """v0 MathRubric's check: math_verify on `\\boxed{answer}` vs `\\boxed{response}` when the
    `math-verify` package is installed; otherwise the same answer after LaTeX normalisation
    (spaces, \\left/\\right, dfrac, \\text{}) or the same number (a difference math_verify would
    also accept; symbolic equivalence needs math-verify)."""
    if response == "":
        return 0.0
    try:
        from math_verify import parse, verify
    except ImportError:
        a, r = _normalise(answer), _normalise(response)
        if a == r:
            return 1.0
        na, nr = _number(a), _number(r)
        return 1.0 if na is not None and nr is not None and abs(na - nr) <= 1e-9 * max(1.0, abs(na)) else 0.0
    try:
        gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout_seconds)
        got = parse(f"\\boxed{{{response}}}", parsing_timeout=timeout_seconds)
        return float(verify(gold, got, timeout_seconds=timeout_seconds))
    except Exception:  # noqa: BLE001 - v0 scored any math_verify failure as 0
        return 0.0


# ---- tools -------------------------------------------------------------------------------------


def python(code: str) -> str:
    """Evaluates a block of Python code and returns output of print() statements. Allowed libraries: astropy, biopython, networkx, numpy, scipy, sympy.

    Args:
        code: A block of Python code

    Returns:
        The output of the code (truncated to 1000 chars) or an error message
    """
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return "Error: Code execution timed out after 10 seconds"
    if out.stderr:
        return f"Error: {out.stderr.strip()}"
    text = out.stdout.strip() if out.stdout else ""
    return text[:1000] + "... (truncated to 1000 chars)" if len(text) > 1000 else text
