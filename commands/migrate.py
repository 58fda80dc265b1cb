"""vf-migrate: rewrite v0 environments, scripts, configs and run dirs to v1 (dry run by default)."""


import typer

from vf import options
from vf.cli import console, entry, guarded

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = options.epilog(
    "What it rewrites and how, rule by rule with before/after examples: MIGRATION.md (section \"vf-migrate rules\").",
    "Exit codes: 0 ok, 1 --check found changes or a manual step (TODO(vf-migrate)) still open, 2 bad usage (missing path, dirty git tree on --write) or a file refused (too large or nested too deeply to parse; reported as SRC900, every other file is still migrated).",
    examples=[
        "vf-migrate environments/my_env/my_env.py",
        "vf-migrate . --write",
        "vf-migrate . --check",
        "vf-migrate outputs/evals --json",
    ])


@app.command(epilog=EPILOG)
@guarded
def command(
    paths: list[str] = typer.Argument(None, help="Files or folders to migrate (folders are walked; run dirs are detected)."),
    write: bool = typer.Option(False, "--write", help="Apply the changes (keeps NAME.bak of every changed file)."),
    force: bool = typer.Option(False, "--force", help="With --write: allow a git tree with uncommitted changes."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when anything would change or a TODO(vf-migrate) is left (for CI); writes nothing."),
    as_json: options.Json = False,
):
    """Migrate v0 (legacy verifiers) environments, scripts/CI files, configs and run dirs to v1.

    Prints a unified diff and a summary; nothing is written without --write. Never runs the code
    it migrates. A second run changes nothing."""
    import json
    import sys
    from pathlib import Path

    from vf.errors import UsageError
    from vf.migrate import apply, dirty_git_trees, plan

    if not paths:
        raise UsageError("missing PATH", hint="e.g. vf-migrate . (dry run), vf-migrate . --write")
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"no such file or folder: {', '.join(missing)}", hint="pass existing files or folders")
    if write and check:
        raise UsageError("--write and --check exclude each other", hint="use --check in CI, --write to apply")
    if write and not force:
        dirty = dirty_git_trees(paths)
        if dirty:
            raise UsageError(f"git tree {dirty[0]} has uncommitted changes; refusing to write",
                             hint="commit or stash them first (so the migration is one reviewable diff), or pass --force")
    report = plan(paths)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        for c in report.changes:
            sys.stdout.write(c.diff())
        console.print(report.text_summary(), markup=False, highlight=False)
    if write:
        apply(report)
        console.print(f"wrote {len(report.changes)} file(s); originals kept as .bak", markup=False)
    refused = [e.file for e in report.entries if e.status == "refused"]
    if refused:  # after every other file was reported (and written)
        raise UsageError(f"{len(refused)} file(s) not read or parsed: {', '.join(refused[:5])}"
                         + (" ..." if len(refused) > 5 else ""),
                         hint="each is over a limit named above (SRC900); split it, or migrate it by hand")
    if check and (report.changes or report.summary()["manual"]):
        raise SystemExit(1)


main = entry(app, dotted=False)


if __name__ == "__main__":
    main()
