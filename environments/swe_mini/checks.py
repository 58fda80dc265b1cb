"""Running a repo's tests inside the rollout's runtime, where the agent cannot reach them.

Each check writes its test files (and the runner below) into a fresh folder with a random name
in the work dir, only after the agent has stopped, and runs them with `python3 -I -S -B`:
isolated mode puts neither the script's folder, the current directory nor PYTHON* variables
on the path, and the repo's folder is *appended* to `sys.path`. So a file the agent left in the
repo cannot stand in for a standard-library module (`unittest.py`) or plant a `sitecustomize`,
and a visible test it edited or deleted does not count: the pristine copy is what runs. Bytecode
in the repo's `__pycache__` is never read (a .pyc written before an edit of the same size in the
same second is stale yet looks current).

A run passes when the runner exits 0 and reports, on a line stamped with a per-check nonce
(given on stdin), that every expected test ran with no failure, error or skip. The code under
test runs in the same process, so code written to forge that line is not ruled out; the nonce
and the exact test count only make it harder.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from vf.runtime.base import Runtime

from .repo import Repo, count_tests

RUNNER = '''\
"""swe-mini test runner: load test files by path, run them with unittest, print one verdict."""
import importlib.util
import sys
import unittest

nonce = sys.stdin.readline().strip()
root, paths = sys.argv[1], sys.argv[2:]
sys.path.append(root)
suite = unittest.TestSuite()
for i, path in enumerate(paths):
    spec = importlib.util.spec_from_file_location(f"swe_mini_check_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
print(f"SWE-MINI {nonce} ran={result.testsRun} failures={len(result.failures)} "
      f"errors={len(result.errors)} skipped={len(result.skipped)}", flush=True)
'''
VERDICT = re.compile(r"^SWE-MINI (\S+) ran=(\d+) failures=(\d+) errors=(\d+) skipped=(\d+)$", re.MULTILINE)


@dataclass
class TestRun:
    passed: bool
    ran: int
    expected: int
    output: str

    def __str__(self) -> str:
        return f"{'passed' if self.passed else 'failed'} ({self.ran}/{self.expected} ran)"


async def run_tests(runtime: Runtime, files: dict[str, str], timeout: float) -> TestRun:
    """Write `files` (test modules by name) into a fresh folder and run them (see module doc)."""
    nonce = secrets.token_hex(12)
    folder = f".swe-mini-check-{nonce[:8]}"
    expected = count_tests(files)
    await runtime.write(f"{folder}/runner.py", RUNNER)
    paths = []
    for name, text in files.items():
        path = f"{folder}/{name.replace('/', '_')}"
        await runtime.write(path, text)
        paths.append(str(runtime.workdir / path))
    # -X pycache_prefix: bytecode is read from (and, with -B, never written to) a folder of its
    # own, never from the repo's __pycache__, which may hold a stale or planted .pyc
    argv = ["python3", "-I", "-S", "-B", "-X", f"pycache_prefix=/tmp/swe-mini-pyc-{nonce}",
            str(runtime.workdir / folder / "runner.py"), str(runtime.workdir), *paths]
    result = await runtime.run(argv, timeout=timeout, input=nonce + "\n")
    output = result.stdout + result.stderr
    verdicts = [m for m in VERDICT.finditer(result.stdout) if m.group(1) == nonce]
    ran = int(verdicts[-1].group(2)) if verdicts else 0
    clean = len(verdicts) == 1 and all(int(x) == 0 for x in verdicts[0].groups()[2:])
    return TestRun(passed=result.ok and clean and ran == expected, ran=ran, expected=expected, output=output)


def apply_script(repo: Repo) -> str:
    """A bash command that applies the gold fix with python3, as an agent's bash tool would."""
    edits = json.dumps([[e.path, e.old, e.new] for e in repo.gold])
    return ("python3 - <<'SWE_MINI_GOLD'\n"
            "import json, pathlib\n"
            f"for path, old, new in json.loads({edits!r}):\n"
            "    p = pathlib.Path(path)\n"
            "    text = p.read_text()\n"
            "    assert text.count(old) == 1, (path, text.count(old))\n"
            "    p.write_text(text.replace(old, new))\n"
            "SWE_MINI_GOLD\n")


async def write_repo(runtime: Runtime, repo: Repo) -> None:
    for path, text in repo.files.items():
        await runtime.write(path, text)


async def gold_problems(runtime: Runtime, repo: Repo, timeout: float) -> list[str]:
    """Why `repo` is not a real task (empty: it is): in a fresh runtime, the repo as shipped must
    fail its visible test and the hidden suite; after the gold fix (applied with a bash command)
    both must pass."""
    problems = []
    await write_repo(runtime, repo)
    before_visible = await run_tests(runtime, {repo.test: repo.files[repo.test]}, timeout)
    before = await run_tests(runtime, repo.suite, timeout)
    if before_visible.passed:
        problems.append("the unpatched repo passes its visible test")
    if before.passed:
        problems.append("the unpatched repo passes the hidden tests")
    applied = await runtime.run(apply_script(repo), timeout=timeout)
    if not applied.ok:
        return problems + [f"the gold fix did not apply: {applied.stderr[-500:]}"]
    after = await run_tests(runtime, repo.suite, timeout)
    if not after.passed:
        problems.append(f"the patched repo fails the hidden tests: {after}\n{after.output[-1500:]}")
    return problems
