"""Procedural bug-fix repositories: `generate(kind, seed)` -> one `GenRepo`, the same for the same
arguments, in any process.

A generated repo is one module (`calc.py`, ...) with two or three small functions, of which one
carries the bug, plus — for `rename` — a `helpers.py` it calls; a visible unittest file
(`test_<module>.py`, one failing test) and a hidden one written only when the episode is scored.
Expected values are computed here by running the *fixed* code, so the tests are right by
construction; the buggy code must give a different answer on the visible input (else the inputs
are drawn again).

Kinds (each fixed by changing exactly one line of one file):

    operator   an arithmetic operator swapped (`a - b` for `a + b`)
    off-by-one a range/slice/comparison bound one off (`range(1, n)` for `range(1, n + 1)`)
    constant   a named unit constant wrong (`MINUTES_PER_HOUR = 61`)
    name       a local variable misspelled (NameError, Python suggests the right name)
    import     a standard-library module used without its `import` line
    rename     a function renamed in helpers.py, its caller in the module still using the old name

The gold fix is given three ways, all equivalent: `repo.gold` (swe-mini `Edit`s, applied by
swe-mini's checks), `fix_command` (a one-line `sed -i` an agent's bash tool would run) and
`fix_edit` (the arguments of the bash harness's `edit` tool).
"""

from __future__ import annotations

import builtins
import keyword
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..swe_mini.repo import Edit, Repo

KINDS = ("operator", "off-by-one", "constant", "name", "import", "rename")
MODULES = ("calc", "shop", "units", "stats", "tools", "mathx", "report", "score", "grid", "store")

# (function name, params, correct body lines, buggy body lines, visible-input sampler)
# Bodies are lists of lines without the 4-space indent; `{c}` is replaced by a per-task choice.
OPERATOR_FUNCS = [
    ("total", "a, b", ["return a + b"], "+", ["-", "*"]),
    ("difference", "a, b", ["return a - b"], "-", ["+"]),
    ("area", "width, height", ["return width * height"], "*", ["+", "-"]),
    ("cost", "price, count", ["return price * count"], "*", ["+"]),
    ("perimeter", "width, height", ["return 2 * (width + height)"], "+", ["-", "*"]),
    ("change", "paid, price", ["return paid - price"], "-", ["+"]),
    ("average2", "a, b", ["return (a + b) / 2"], "+", ["-"]),
    ("remaining", "stock, sold", ["left = stock - sold", "return left"], "-", ["+"]),
]
OFF_BY_ONE_FUNCS = [
    ("sum_to", "n", ["total = 0", "for i in range(1, n + 1):", "    total += i", "return total"],
     ("range(1, n + 1)", "range(1, n)"), "int"),
    ("count_up", "n", ["return list(range(1, n + 1))"], ("range(1, n + 1)", "range(1, n)"), "int"),
    ("first_n", "items, n", ["return items[:n]"], ("items[:n]", "items[:n - 1]"), "list_n"),
    ("last", "items", ["return items[len(items) - 1]"], ("items[len(items) - 1]", "items[len(items)]"), "list"),
    ("is_adult", "age", ["return age >= 18"], ("age >= 18", "age > 18"), "adult"),
    ("factorial", "n", ["result = 1", "for i in range(2, n + 1):", "    result *= i", "return result"],
     ("range(2, n + 1)", "range(2, n)"), "int"),
    ("evens_below", "n", ["return [i for i in range(0, n, 2)]"], ("range(0, n, 2)", "range(1, n, 2)"), "int"),
]
CONSTANTS = [  # (constant, value, function, param)
    ("MINUTES_PER_HOUR", 60, "hours_to_minutes", "hours"),
    ("SECONDS_PER_MINUTE", 60, "minutes_to_seconds", "minutes"),
    ("HOURS_PER_DAY", 24, "days_to_hours", "days"),
    ("DAYS_PER_WEEK", 7, "weeks_to_days", "weeks"),
    ("CENTS_PER_DOLLAR", 100, "dollars_to_cents", "dollars"),
    ("GRAMS_PER_KILOGRAM", 1000, "kilograms_to_grams", "kilograms"),
    ("MONTHS_PER_YEAR", 12, "years_to_months", "years"),
    ("INCHES_PER_FOOT", 12, "feet_to_inches", "feet"),
    ("METERS_PER_KILOMETER", 1000, "kilometers_to_meters", "kilometers"),
]
NAME_FUNCS = [  # (function, params, body with {v} for the variable, variable names, input shape)
    ("mean", "values", ["{v} = sum(values)", "return {v} / len(values)"], ("total", "summed", "acc"), "list"),
    ("spread", "values", ["{v} = max(values) - min(values)", "return {v}"], ("width", "diff", "gap"), "list"),
    ("shout", "word", ["{v} = word.upper()", 'return {v} + "!"'], ("loud", "upper", "result"), "name"),
    ("double_all", "values", ["{v} = [x * 2 for x in values]", "return {v}"], ("doubled", "result", "out"), "list"),
    ("count_long", "words", ["{v} = [w for w in words if len(w) > 3]", "return len({v})"],
     ("longer", "kept", "found"), "words"),
]
IMPORT_FUNCS = [  # (module, function, params, body)
    ("math", "hypotenuse", "a, b", ["return math.sqrt(a * a + b * b)"], "pair"),
    ("math", "round_up", "x", ["return math.ceil(x)"], "float"),
    ("math", "circle_area", "r", ["return round(math.pi * r * r, 2)"], "int"),
    ("string", "letter_at", "i", ["return string.ascii_lowercase[i]"], "index"),
    ("json", "to_json", "data", ["return json.dumps(data, sort_keys=True)"], "dict"),
    ("statistics", "middle", "values", ["return statistics.median(values)"], "list"),
]
RENAMES = [  # (old name, new name, params, helper body, caller, caller body using {h})
    ("celsius", "to_celsius", "f", ["return (f - 32) * 5 / 9"], "report_temp", "f",
     ['return str(round(helpers.{h}(f))) + "C"'], "temp"),
    ("tax", "sales_tax", "amount", ["return round(amount * 0.2, 2)"], "with_tax", "amount",
     ["return amount + helpers.{h}(amount)"], "int"),
    ("clean", "clean_name", "name", ["return name.strip().title()"], "greeting", "name",
     ['return "Hello, " + helpers.{h}(name)'], "name"),
    ("square", "squared", "x", ["return x * x"], "sum_squares", "values",
     ["return sum(helpers.{h}(v) for v in values)"], "list"),
    ("halve", "half_of", "x", ["return x / 2"], "halves", "values",
     ["return [helpers.{h}(v) for v in values]"], "list"),
]
DISTRACTORS = [  # correct functions that share the module (the hidden tests check them too)
    ("double", "x", ["return x * 2"], "int"),
    ("is_even", "n", ["return n % 2 == 0"], "int"),
    ("clamp", "x, low, high", ["return max(low, min(x, high))"], "clamp"),
    ("initials", "name", ['return "".join(p[0] for p in name.split())'], "name"),
    ("biggest", "values", ["return max(values)"], "list"),
    ("word_count", "text", ["return len(text.split())"], "text"),
]
WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "pixel")


@dataclass(frozen=True)
class GenRepo:
    """One generated task: the swe-mini `Repo` plus its gold fix as an agent would apply it."""

    kind: str
    seed: int
    repo: Repo
    module: str
    """The file with the bug."""
    fix_command: str
    fix_edit: dict[str, str]


def _sample(rng: random.Random, shape: str) -> tuple:
    """Arguments for one call of a function whose inputs have this shape."""
    n = rng.randint
    return {
        "int": lambda: (n(3, 9),),
        "pair": lambda: (n(2, 9), n(2, 9)),
        "list": lambda: ([n(1, 20) for _ in range(n(3, 5))],),
        "list_n": lambda: ([n(1, 20) for _ in range(n(4, 6))], n(2, 3)),
        "adult": lambda: (rng.choice([18, 18, 17, 30, 5]),),
        "float": lambda: (n(1, 9) + rng.choice([0.2, 0.5, 0.7]),),
        "index": lambda: (n(0, 25),),
        "dict": lambda: ({rng.choice(WORDS): n(1, 9), "id": n(1, 99)},),
        "clamp": lambda: (n(-5, 15), 0, 10),
        "name": lambda: (f"{rng.choice(WORDS)} {rng.choice(WORDS)}",),
        "text": lambda: (" ".join(rng.choice(WORDS) for _ in range(n(2, 5))),),
        "words": lambda: ([rng.choice(WORDS + ("ox", "cat", "sun")) for _ in range(n(3, 5))],),
        "temp": lambda: (rng.choice([32, 50, 68, 86, 212, 104]),),
    }[shape]()


def _function(name: str, params: str, body: list[str]) -> str:
    return f"def {name}({params}):\n" + "".join(f"    {line}\n" for line in body)


def _call(namespace: dict, name: str, args: tuple) -> Any:
    try:
        return namespace[name](*args)
    except Exception as e:  # noqa: BLE001 - the buggy code may raise; that is a detectable answer
        return e


def _exec(files: dict[str, str], module: str) -> dict:
    """Run the repo's `module` in this process (local `import helpers` resolved from `files`)."""
    namespace: dict = {}
    if "helpers.py" in files:
        helpers: dict = {}
        exec(files["helpers.py"], helpers)  # noqa: S102 - code generated here, never the agent's
        namespace["helpers"] = type("helpers", (), {k: staticmethod(v) for k, v in helpers.items()
                                                    if callable(v)})
    source = files[module].replace("import helpers\n", "")
    exec(source, namespace)  # noqa: S102
    return namespace


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b)
    return a == b  # as assertEqual sees it (3 == 3.0)


def _test_file(module: str, cls: str, cases: list[tuple[str, tuple, Any]]) -> str:
    names = sorted({name for name, _, _ in cases})
    lines = ["import unittest", "", f"from {module} import {', '.join(names)}", "", "",
             f"class {cls}(unittest.TestCase):"]
    for i, (name, args, expected) in enumerate(cases):
        call = f"{name}({', '.join(repr(a) for a in args)})"
        lines += [f"    def test_{name}_{i}(self):", f"        self.assertEqual({call}, {expected!r})", ""]
    return "\n".join(lines) + "\nif __name__ == '__main__':\n    unittest.main()\n"


def _bug(kind: str, rng: random.Random) -> tuple[str, str, list[str], list[str], str, dict[str, str]]:
    """(function, params, fixed body, buggy body, input shape, extra files) for one bug of `kind`;
    the bodies differ in exactly one line. `rename` also returns helpers.py (fixed and buggy are
    the caller's bodies; helpers.py is the same in both)."""
    if kind == "operator":
        name, params, body, op, wrong = rng.choice(OPERATOR_FUNCS)
        line = body[-1] if op in body[-1] else body[0]
        bad = [b.replace(f" {op} ", f" {rng.choice(wrong)} ", 1) if b == line else b for b in body]
        return name, params, body, bad, "pair" if "," in params else "int", {}
    if kind == "off-by-one":
        name, params, body, (good, wrong), shape = rng.choice(OFF_BY_ONE_FUNCS)
        return name, params, body, [b.replace(good, wrong) for b in body], shape, {}
    if kind == "constant":
        const, value, name, param = rng.choice(CONSTANTS)
        wrong = rng.choice([value + 1, value - 1, value * 10, value + 10])
        body = [f"return {param} * {const}"]
        return name, param, [f"{const} = {value}", *body], [f"{const} = {wrong}", *body], "int", {}
    if kind == "name":
        name, params, body, variables, shape = rng.choice(NAME_FUNCS)
        v = rng.choice(variables)
        good = [b.format(v=v) for b in body]
        return name, params, good, [good[0], body[1].format(v=_typo(v, rng))], shape, {}
    if kind == "import":
        module, name, params, body, shape = rng.choice(IMPORT_FUNCS)
        return name, params, [f"import {module}", *body], ["", *body], shape, {}
    old, new, hparams, hbody, name, params, body, shape = rng.choice(RENAMES)
    helpers = '"""Shared helpers."""\n\n\n' + _function(new, hparams, hbody)
    return (name, params, [b.format(h=new) for b in body], [b.format(h=old) for b in body], shape,
            {"helpers.py": helpers})


def _typo(word: str, rng: random.Random) -> str:
    """A misspelling Python's NameError can still point back from (one letter dropped or doubled),
    never a keyword or a builtin (`width` -> `with` would be a syntax error, not a NameError)."""
    while True:
        i = rng.randrange(1, len(word) - 1)
        typo = word[:i] + word[i + 1:] if rng.random() < 0.5 else word[:i] + word[i] + word[i:]
        if not keyword.iskeyword(typo) and not hasattr(builtins, typo):
            return typo


def _module_text(title: str, header: list[str], functions: list[str]) -> str:
    top = f'"""{title}"""\n' + "".join(f"{h}\n" for h in header)
    return top + "\n\n" + "\n\n".join(functions)


@lru_cache(maxsize=4096)
def generate(kind: str, seed: int) -> GenRepo:
    """The task of `kind` drawn with `seed` (deterministic; see the module doc)."""
    if kind not in KINDS:
        raise ValueError(f"unknown bug kind {kind!r} (kinds: {', '.join(KINDS)})")
    rng = random.Random(f"swe-gen:{kind}:{seed}")
    for _ in range(100):
        repo = _attempt(kind, seed, rng)
        if repo is not None:
            return repo
    raise RuntimeError(f"swe-gen: no valid {kind} task for seed {seed}")  # pragma: no cover


def _attempt(kind: str, seed: int, rng: random.Random) -> GenRepo | None:
    module = rng.choice(MODULES)
    name, params, good, bad, shape, extra = _bug(kind, rng)
    # module-level lines (an import, a constant) go to the top; the rest is the function body
    top_good = [g for g in good if g.startswith("import ") or re.match(r"^[A-Z_]+ = ", g)]
    top_bad = [b for b in bad if b.startswith("import ") or re.match(r"^[A-Z_]+ = ", b)]
    body_good = [g for g in good if g not in top_good and g != ""]
    body_bad = [b for b in bad if b not in top_bad and b != ""]
    if kind == "rename":
        top_good = top_bad = ["import helpers"]
    others = rng.sample(DISTRACTORS, rng.randint(1, 2))
    funcs_good = [_function(n, p, b) for n, p, b, _ in others]
    position = rng.randint(0, len(funcs_good))
    files_good, files_bad = dict(extra), dict(extra)
    title = f"{module.capitalize()} utilities."
    files_good[f"{module}.py"] = _module_text(title, top_good, funcs_good[:position] + [_function(name, params, body_good)] + funcs_good[position:])
    files_bad[f"{module}.py"] = _module_text(title, top_bad, funcs_good[:position] + [_function(name, params, body_bad)] + funcs_good[position:])
    ns_good, ns_bad = _exec(files_good, f"{module}.py"), _exec(files_bad, f"{module}.py")
    visible_args = _sample(rng, shape)
    expected = _call(ns_good, name, visible_args)
    if isinstance(expected, Exception) or _same(expected, _call(ns_bad, name, visible_args)):
        return None
    hidden = [(name, _sample(rng, shape)) for _ in range(3)] + [(n, _sample(rng, s)) for n, _, _, s in others]
    hidden_cases = [(n, a, _call(ns_good, n, a)) for n, a in hidden]
    if any(isinstance(e, Exception) for _, _, e in hidden_cases):
        return None
    test = f"test_{module}.py"
    files_bad[test] = _test_file(module, f"Test{module.capitalize()}", [(name, visible_args, expected)])
    edit = _one_line_edit(files_bad[f"{module}.py"], files_good[f"{module}.py"])
    if edit is None:
        return None
    old, new = edit
    gold = [Edit(f"{module}.py", old, new)]
    repo = Repo(name=f"{kind}-{seed}", difficulty="easy", kind=kind, symptom=_symptom(name, visible_args, expected, ns_bad),
                test=test, files=files_bad,
                hidden={f"test_hidden_{module}.py": _test_file(module, f"TestHidden{module.capitalize()}", hidden_cases)},
                gold=gold)
    return GenRepo(kind=kind, seed=seed, repo=repo, module=f"{module}.py",
                   fix_command=_sed(old, new, f"{module}.py"),
                   fix_edit={"path": f"{module}.py", "old_str": old, "new_str": new})


def _one_line_edit(bad: str, good: str) -> tuple[str, str] | None:
    """The one differing line (old, new), old unique in the file; for a missing line, the line
    before it is the anchor (old) and comes back followed by the added line (new)."""
    bad_lines, good_lines = bad.split("\n"), good.split("\n")
    if len(bad_lines) == len(good_lines):
        diff = [(b, g) for b, g in zip(bad_lines, good_lines) if b != g]
        if len(diff) != 1 or bad.count(diff[0][0].strip()) != 1:
            return None
        old, new = diff[0]
        return old.strip(), new.strip()
    i = next(i for i, (b, g) in enumerate(zip(bad_lines, good_lines + [""])) if b != g)
    anchor = bad_lines[i - 1]
    if i == 0 or bad.count(anchor) != 1:
        return None
    return anchor, anchor + "\n" + good_lines[i]


def _sed(old: str, new: str, path: str) -> str:
    """`sed -i` that replaces `old` by `new`: a one-line substitution, or (`new` = `old` plus a
    line: the missing import) that line inserted first, before the module docstring."""
    if "\n" in new:  # a missing line (the import): put it first
        return f"sed -i '1i {new.split(chr(10), 1)[1]}' {path}"
    return f"sed -i 's/{_sed_pattern(old)}/{_sed_replacement(new)}/' {path}"


def _sed_pattern(text: str) -> str:
    return re.sub(r"([\\/.*\[\]^$])", r"\\\1", text)


def _sed_replacement(text: str) -> str:
    return re.sub(r"([\\/&])", r"\\\1", text)


def _symptom(name: str, args: tuple, expected: Any, ns_bad: dict) -> str:
    call = f"`{name}({', '.join(repr(a) for a in args)})`"
    got = _call(ns_bad, name, args)
    if isinstance(got, Exception):
        return f"{call} raises {type(got).__name__}; it should return {expected!r}."
    return f"{call} returns {got!r}; it should return {expected!r}."
