"""What every command shares: the entry point (`run_app`: --version, dotted config flags),
config layering (`overrides`), error → exit code mapping, stderr console, progress display.
The shared option definitions are in vf.options.

stdout carries data only (`--json`, JSONL streams); people's text goes to stderr: a rich
progress bar on a TTY, plain lines otherwise (or with NO_COLOR set).
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from vf.cli_compat import NO_OP_FLAGS, layers_from, run_dir
from vf.errors import VfError
from vf.mixture import run_label
from vf.rundir import default_run_dir

console = Console(stderr=True, highlight=False, soft_wrap=True)


def fancy() -> bool:
    return sys.stderr.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def fail(message: str, hint: str | None = None, code: int = 2) -> None:
    elastic_error_file(message, hint)
    if code == 2 and os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("RANK", "0") != "0":
        raise SystemExit(code)  # under torchrun every rank meets the same bad usage: rank 0 says it once
    # escaped: a message quoting input or a library ("[enforce fail at ...]") is not markup
    console.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    if hint:
        console.print(f"  [dim]hint:[/] {escape(hint)}", markup=True)
    raise SystemExit(code)


def elastic_error_file(message: str, hint: str | None) -> None:
    """Under torchrun: put the error where torchrun looks for a worker's (TORCHELASTIC_ERROR_FILE),
    so its failure report names the reason ("traceback: error: ...") instead of a pointer to its
    docs. torchrun itself still exits 1 with its own traceback when any worker fails: a worker
    cannot change that (vf-train's exit code is the worker's, 2, only without torchrun)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    text = f"error: {message}" + (f"\n  hint: {hint}" if hint else "")
    try:
        import json

        with open(path, "w") as f:
            json.dump({"message": {"message": text, "extraInfo": {"py_callstack": text,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body: VfError → message + its exit code; Ctrl-C → 130; bugs → traceback + 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VfError as e:
            fail(e.message, e.hint, e.exit_code)
        except KeyboardInterrupt:
            console.print("interrupted; everything finished so far is saved")
            raise SystemExit(130) from None
        except (SystemExit, BrokenPipeError):
            raise
        except Exception:  # a bug: show it, so it can be reported
            console.print(traceback.format_exc(), markup=False)
            console.print("[bold red]error:[/] unexpected failure (above); please report it", markup=True)
            raise SystemExit(1) from None

    return wrapper


def split_dotted(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate dotted config flags (`--sampling.temperature 0.7`, `--taskset.size=5`) from the
    rest, so the flag parser never mistakes their values for positional arguments."""
    rest, dotted = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg.startswith("--") and "." in arg.split("=", 1)[0]:
            dotted.append(arg)
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                dotted.append(argv[i + 1])
                i += 1
        else:
            rest.append(arg)
        i += 1
    return rest, dotted


def split_at_files(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate verifiers-style config files (`@ eval.toml` or `@eval.toml`) from the rest."""
    rest, files = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == "@":
            if i + 1 >= len(argv):
                fail("@ needs a file", hint="e.g. @ eval.toml")
            files.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("@") and len(arg) > 1:
            files.append(arg[1:])
        else:
            rest.append(arg)
        i += 1
    return rest, files


class Invocation:
    """What `run_app` pulled out of argv before typer parses the rest."""

    dotted: list[str] = []
    at_files: list[str] = []


def dotted_args() -> list[str]:
    """The dotted flags of this invocation (set by `run_app`)."""
    return list(Invocation.dotted)


def prog_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "vf"


def prepare(args: list[str], *, dotted: bool = True, compat: bool = False) -> list[str]:
    """What every command does to argv before typer parses it: dotted config flags pulled out
    (refused with exit 2 by a command that takes no config keys, `dotted=False`); with
    `compat=True`, verifiers 0.4.0's `@ FILE.toml` and no-op flags (vf.cli_compat). Returns the
    rest; the pulled-out parts are in `Invocation`."""
    args = list(args)
    head = args[: args.index("--")] if "--" in args else args
    files: list[str] = []
    if compat:
        for flag in [a for a in head if a in NO_OP_FLAGS]:
            console.print(f"note: {flag} is a verifiers option with no effect in vf (nothing is uploaded; "
                          "progress goes to stderr)", markup=False)
            args.remove(flag)
        args, files = split_at_files(args)
    rest, found = split_dotted(args)
    if found and not dotted:
        fail(f"{prog_name()} takes no config keys, got {found[0]}", hint=f"see {prog_name()} --help for its options")
    Invocation.dotted, Invocation.at_files = found, files
    return rest


def run_app(app: Any, argv: list[str] | None = None, *, dotted: bool = True, compat: bool = False) -> None:
    """Console-script entry shared by every command: `--version`, then `prepare`, then typer."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in (args[: args.index("--")] if "--" in args else args):
        from vf.version import version_line

        print(version_line())
        raise SystemExit(0)
    app(args=prepare(args, dotted=dotted, compat=compat), prog_name=prog_name())


def entry(app: Any, *, dotted: bool = True, compat: bool = False) -> Callable[[], None]:
    """A console-script `main` for `app`; keeps its settings for vf.cli_docs (dry parses)."""
    def main(argv: list[str] | None = None) -> None:
        run_app(app, argv, dotted=dotted, compat=compat)

    main.app, main.dotted, main.compat = app, dotted, compat  # type: ignore[attr-defined]
    return main


def overrides(extra_args: list[str], flags: dict[str, Any], config_file: str | None = None,
              layers: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """layers (lowest first) ← config file ← explicit flags ← dotted extras, as one nested override
    dict. Flags left unset (None) are absent, so a resumed run keeps its saved values."""
    from vf.config import deep_merge, load_yaml, parse_dotted_args, set_dotted

    over: dict[str, Any] = {}
    for layer in layers:
        over = deep_merge(over, layer)
    if config_file:
        over = deep_merge(over, load_yaml(config_file))
    explicit: dict[str, Any] = {}
    for key, value in flags.items():
        if value is not None:
            set_dotted(explicit, key, value)
    extra = extra_args if isinstance(extra_args, dict) else parse_dotted_args(list(extra_args))
    return deep_merge(deep_merge(over, explicit), extra)


class Progress:
    """done/total, running mean reward, errors, tokens/s."""

    def __init__(self, label: str, total: int, done: int = 0, rewards: list[float] | None = None):
        self.label, self.total, self.done = label, total, done
        self.rewards = list(rewards or [])
        self.errors = 0
        self.tokens = 0
        self.start = time.time()
        self._last = 0.0
        self._bar = None
        if fancy() and total:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                                     console=console, transient=False)
            self._task = self._bar.add_task(label, total=total, completed=done, stats="")
            self._bar.start()

    def stats(self) -> str:
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")
        rate = self.tokens / max(time.time() - self.start, 1e-9)
        return f"reward {mean:.3f}  errors {self.errors}  {rate:.0f} tok/s"

    def update(self, reward: float | None, tokens: int = 0, error: bool = False) -> None:
        self.done += 1
        self.tokens += tokens
        if error:
            self.errors += 1
        elif reward is not None:
            self.rewards.append(reward)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, stats=self.stats())
        elif time.time() - self._last > 2.0 or self.done == self.total:
            self._last = time.time()
            console.print(f"[{self.label}] {self.done}/{self.total}  {self.stats()}", markup=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def command_overrides(flags: dict[str, Any], config_file: str | None, output: str | None,
                      output_dir: str | None) -> tuple[dict[str, Any], str | None, str | None]:
    """vf-eval / vf-rollout: @ files ← --config ← flags ← dotted flags (either spelling), as one
    override tree; plus the run dir (-o, or what --run.* asks for) and the parent of an automatic
    run dir (--output-dir). Notes about ignored verifiers settings go to stderr."""
    files, dotted, run, notes = layers_from(Invocation.dotted, Invocation.at_files)
    for note in notes:
        console.print(f"note: {note}", markup=False)
    output_dir = output_dir or run.get("output_dir")
    return overrides(dotted, flags, config_file, layers=files), run_dir(run, output, output_dir), output_dir


def place_run(config: Any, output: str | None, output_dir: str | None) -> str | None:
    """-o wins; else `--output-dir DIR` holds an automatically named run dir; else our default."""
    if output is not None or output_dir is None or config is None:
        return output
    return str(Path(output_dir) / default_run_dir(run_label(config), config.model).name)
