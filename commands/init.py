"""vf-init: scaffold a v1 environment package (pyproject.toml + package), as verifiers' vf-init does.

The scaffold works as written: it loads, `vf-validate` passes on it, and `vf-eval` runs it; the
user replaces the example data and reward with their own.
"""


import typer

from vf import options
from vf.cli import console, entry, guarded

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = options.epilog(
    "Writes PATH/NAME_WITH_UNDERSCORES/{pyproject.toml, README.md, PACKAGE/__init__.py, "
    "PACKAGE/taskset.py}. The example taskset answers small sums; replace load() and the reward.",
    "Exit codes: 0 ok, 2 bad name or the package exists (pass --force to overwrite).",
    examples=[
        "vf-init my-env",
        "vf-init my-env -p ./environments --force",
        "vf-validate ./environments/my_env/my_env",
        "vf-eval ./environments/my_env/my_env -n 3 -r 2",
    ])

PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
description = "{name}: a v1 environment for vf."
requires-python = ">=3.11"
dependencies = ["vf"]

[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
packages = ["{package}"]

[project.entry-points."vf.environments"]
{name} = "{package}"
"""

INIT = """\
from .taskset import {cls}Taskset

__all__ = ["{cls}Taskset"]
"""

TASKSET = '''\
import vf


class {cls}Data(vf.TaskData):
    """One task's data: the prompt (inherited) plus the reference answer."""

    answer: str


class {cls}Config(vf.TasksetConfig):
    num_tasks: int = 5
    """How many tasks to build (--taskset.num-tasks 10)."""


class {cls}Task(vf.Task[{cls}Data, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_reply(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def correct(self, task, trace) -> float:
        return float(task.answer in trace.last_reply)

    def validate(self) -> str:
        """The gold reply: `vf-validate` checks that it earns full reward."""
        return f"The answer is {{self.data.answer}}."


class {cls}Taskset(vf.Taskset[{cls}Task, {cls}Config]):
    def load(self):
        for i in range(self.config.num_tasks):
            a, b = 2 + i, 3 + 2 * i
            yield {cls}Data(id=f"sum-{{i}}", prompt=f"What is {{a}} + {{b}}? Reply with the number.",
                            answer=str(a + b))
'''

README = """\
# {name}

A v1 environment for vf, scaffolded by `vf-init`.

```bash
vf-validate {package_path}        # model-free: every gold reply earns reward 1.0
vf-eval {package_path} -n 3 -r 2  # the built-in tiny model, CPU
pip install -e {project_path}     # then it is also `vf-eval {name}`
```

Edit `{package}/taskset.py`: `load()` yields the tasks, `@vf.reward` methods score a trace.
"""


@app.command(epilog=EPILOG)
@guarded
def command(
    name: str | None = typer.Argument(None, help="Environment id, e.g. my-env (letters, digits, - and _)."),
    path: str = typer.Option("./environments", "-p", "--path", help="Folder the package is created in."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing package."),
):
    """Scaffold a v1 environment package NAME that loads, validates and runs as written."""
    import re
    import shutil
    from pathlib import Path

    from vf.errors import UsageError

    if not name or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise UsageError(f"bad environment name {name!r}" if name else "missing NAME",
                         hint="a name starts with a letter and has letters, digits, - or _ (e.g. my-env)")
    package = name.replace("-", "_").lower()
    cls = "".join(part.capitalize() for part in re.split(r"[-_]", name) if part)
    project = Path(path) / package
    if project.exists() and any(project.iterdir()):
        if not force:
            raise UsageError(f"{project} already exists", hint="choose another name or -p, or pass --force")
        shutil.rmtree(project)
    values = {"name": name, "package": package, "cls": cls, "project_path": str(project),
              "package_path": str(project / package)}
    files = {
        project / "pyproject.toml": PYPROJECT,
        project / "README.md": README,
        project / package / "__init__.py": INIT,
        project / package / "taskset.py": TASKSET,
    }
    for file, template in files.items():
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(template.format(**values))
        console.print(f"  write  {file}", markup=False)
    console.print(f"next:\n  vf-validate {project / package}\n  vf-eval {project / package} -n 3 -r 2", markup=False)


main = entry(app, dotted=False)


if __name__ == "__main__":
    main()
