"""verifiers' uv-script programs (`runtime.prepare_uv_script`), made to run in an offline runtime.

A verifiers 0.4 harness launches its program as a PEP 723 script: Python source whose leading
`# /// script` block names its `dependencies` and `requires-python`. verifiers runs `uv sync
--script` inside the runtime, which needs the network there. vf's sandbox has none, so the
script's dependencies are resolved here, on the host, once per (dependencies, interpreter), by
the same installer as the agents' (vf.harnesses.install: a virtual environment under the agent
cache, `pip install` from pip's own configured index, wheels only, a progress line on stderr);
the script itself is stored content-addressed beside it; the runtime mounts both read-only.

The returned argv is verifiers': with `activate` (the default) `sh -c` exports `VIRTUAL_ENV` and
puts the environment's `bin` first on PATH before exec'ing the interpreter on the script, so the
program's children find its console scripts; without it, the bare interpreter and script. uv is
not needed, on the host or in the runtime. An `env` naming an index the script's packages come
from (`PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`, `PIP_FIND_LINKS`, `PIP_NO_INDEX`, or uv's `UV_INDEX_URL`,
`UV_DEFAULT_INDEX`, `UV_EXTRA_INDEX_URL`, `UV_FIND_LINKS`, `UV_NO_INDEX`) is passed to that `pip install`.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from vf.atomic import write_atomic
from vf.errors import HarnessError
from vf.harnesses.install import PythonProgram, find_python

BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
"""PEP 723's reference regular expression for a metadata block."""
DEFAULT_PYTHON = "/usr/bin/python3"
"""The interpreter the sandbox has (it mounts /usr): used whenever the script accepts it."""
INDEX_VARS = {"PIP_INDEX_URL": "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL": "PIP_EXTRA_INDEX_URL",
              "PIP_FIND_LINKS": "PIP_FIND_LINKS", "UV_INDEX_URL": "PIP_INDEX_URL",
              "UV_DEFAULT_INDEX": "PIP_INDEX_URL", "UV_EXTRA_INDEX_URL": "PIP_EXTRA_INDEX_URL",
              "UV_INDEX": "PIP_EXTRA_INDEX_URL", "UV_FIND_LINKS": "PIP_FIND_LINKS",
              "PIP_NO_INDEX": "PIP_NO_INDEX", "UV_NO_INDEX": "PIP_NO_INDEX"}
ACTIVATE = ('export VIRTUAL_ENV="$1" PATH="${1}/bin:$PATH" UV_RUN_RECURSION_DEPTH=1; '
            'shift; exec "$@"')
"""verifiers' activation wrapper (less its uv install dir: there is no uv here)."""


@dataclass(frozen=True)
class ScriptMetadata:
    dependencies: tuple[str, ...] = ()
    requires_python: str | None = None


@dataclass(frozen=True)
class PreparedScript:
    """A script ready to run: its environment (installed) and its stored source."""

    program: PythonProgram
    path: Path

    def argv(self, activate: bool = True) -> list[str]:
        """verifiers' `prepare_uv_script` argv for this script (see the module docstring)."""
        interpreter, script = self.program.interpreter, str(self.path)
        env = [f"{k}={v}" for k, v in self.program.env.items()]  # a copied interpreter's libpython
        if not activate:  # nor vf's own venv (the subprocess runtime inherits vf's environment)
            return ["env", "-u", "VIRTUAL_ENV", *env, interpreter, script]
        venv = str(Path(interpreter).parent.parent)
        return ["sh", "-c", ACTIVATE, "uv-script", venv, *(["env", *env] if env else []), interpreter, script]

    @property
    def mounts(self) -> tuple[str, str]:
        """What the runtime must see read-only: the environment and the script's directory."""
        return str(self.program.dir), str(self.path.parent)


def read_metadata(source: bytes) -> ScriptMetadata:
    """The script's `# /// script` block (none: no dependencies). HarnessError when it is
    malformed (two blocks, TOML that does not parse, dependencies that are not strings)."""
    text = source.decode("utf-8", errors="replace")
    blocks = [m for m in BLOCK.finditer(text) if m.group("type") == "script"]
    if not blocks:
        return ScriptMetadata()
    if len(blocks) > 1:
        raise HarnessError("uv script has more than one `# /// script` block (PEP 723 allows one)")
    content = "".join(line[2:] if line.startswith("# ") else line[1:]
                      for line in blocks[0].group("content").splitlines(keepends=True))
    try:
        table = tomllib.loads(content)
    except tomllib.TOMLDecodeError as e:
        raise HarnessError(f"uv script's `# /// script` block is not TOML: {e}") from None
    deps = table.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise HarnessError("uv script's `dependencies` must be a list of requirement strings")
    requires = table.get("requires-python")
    if requires is not None and not isinstance(requires, str):
        raise HarnessError("uv script's `requires-python` must be a string")
    return ScriptMetadata(tuple(deps), requires)


def _version_of(python: str) -> Version:
    done = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise HarnessError(f"cannot run {python}: {done.stderr.strip()[-300:]}")
    return Version(done.stdout.strip())


def pick_interpreter(requires_python: str | None) -> tuple[str, bool]:
    """(interpreter, copy it into the install): the sandbox's own Python when the script
    accepts it, else a newer host one (vf.harnesses.install.find_python, copied)."""
    if requires_python is None:
        return DEFAULT_PYTHON, False
    try:
        spec = SpecifierSet(requires_python)
    except InvalidSpecifier:
        raise HarnessError(f"uv script's requires-python {requires_python!r} is not a version specifier") from None
    if _version_of(DEFAULT_PYTHON) in spec:
        return DEFAULT_PYTHON, False
    floors = [Version(s.version).release for s in spec if s.operator in (">=", ">", "~=", "==")]
    minimum = max(floors, default=(3, 0))
    python, copy = find_python((minimum[0], minimum[1] if len(minimum) > 1 else 0))
    if _version_of(python) not in spec:
        raise HarnessError(f"uv script needs Python {requires_python}; the newest found on this host "
                           f"({python}) is not", hint="install a matching python3.N on PATH")
    return python, copy


def store_script(source: bytes, root: Path) -> Path:
    """The script at a content-addressed path under `root/scripts` (world-readable, written
    through a temporary name so a concurrent reader never sees half of it)."""
    directory = root / "scripts"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / f"{hashlib.sha256(source).hexdigest()}.py"
    if not path.exists():
        write_atomic(path, source, mode=0o644)
    return path


def prepare(source: str | bytes, env: dict[str, str] | None = None) -> PreparedScript:
    """Resolve and install the script's dependencies on the host (once; blocking, so call it in
    a thread) and store the script. HarnessError, with pip's words, when that fails."""
    data = source.encode() if isinstance(source, str) else source
    meta = read_metadata(data)
    python, copy = pick_interpreter(meta.requires_python)
    pip_env = tuple(sorted({INDEX_VARS[k]: v for k, v in (env or {}).items() if k in INDEX_VARS}.items()))
    program = PythonProgram("uv-script", "pep723", meta.dependencies, python=python, copy_python=copy,
                            pip_env=pip_env)
    program.ensure()
    return PreparedScript(program, store_script(data, program.root))
