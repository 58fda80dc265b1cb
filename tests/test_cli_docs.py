"""The CLI reference cannot drift: docs/cli.md is the --help texts, every example and every
vf-* line in the docs parses, every cited repo path exists, --version works everywhere."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from conftest import run_cli

from vf import cli_docs

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "MIGRATION.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_cli_md_is_current():
    assert (ROOT / "docs" / "cli.md").read_text() == cli_docs.render(), \
        "docs/cli.md is stale: run `python -m vf.cli_docs --write`"


def test_every_console_script_is_documented():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {k: v.split(":")[0] for k, v in scripts.items()} == cli_docs.SCRIPTS
    assert all(v.endswith(":main") for v in scripts.values())


def examples(name: str) -> list[str]:
    text = cli_docs.help_text(name)
    block = text.split("Examples:\n", 1)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("name", list(cli_docs.SCRIPTS))
def test_each_help_has_examples_that_parse(name):
    found = examples(name)
    assert len(found) >= 3
    for line in found:
        cli_docs.dry_parse(line)


def invocations(path: Path) -> list[str]:
    """vf commands on lines of fenced code blocks; a block after "Before:" shows old syntax."""
    out, fenced, skip, prev = [], False, False, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            skip = fenced and prev.strip().rstrip(":").lower() == "before"
            continue
        if line.strip():
            prev = line if not fenced else prev
        if fenced and not skip:
            for part in re.split(r"\s*(?:&&|;)\s*", line.strip()):
                words = part.split()
                if words and words[0] in cli_docs.SCRIPTS:
                    out.append(re.split(r"\s[|&>]|\s&$", part)[0])
    return out


def test_every_vf_line_in_the_docs_parses():
    lines = [(p.name, line) for p in DOCS for line in invocations(p)]
    assert len(lines) >= 20
    bad = []
    for where, line in lines:
        try:
            cli_docs.dry_parse(line)
        except Exception as e:  # noqa: BLE001 - collect every failure
            bad.append(f"{where}: {line}: {e}")
    assert not bad, "\n".join(bad)


def test_dry_parse_catches_unknown_flags_and_keys():
    import click

    from vf.errors import ConfigError

    with pytest.raises(click.UsageError):
        cli_docs.dry_parse("vf-eval reverse-text --num-taskz 3")
    with pytest.raises(ConfigError):
        cli_docs.dry_parse("vf-eval reverse-text --sampling.max-tokenz 3")
    with pytest.raises(click.UsageError):
        cli_docs.dry_parse("vf-serve --port 8000 --sampling.temperature 1")
    cli_docs.dry_parse("vf-eval reverse-text --client.base-url http://x/v1 --run.name a --no-push")


CITATION = re.compile(r"(?<![\w/.])((?:docs|vf|trainer|models|commands|environments|tests|benchmarks)/[\w./-]+"
                      r"\.(?:md|py|json|yaml|toml))")


def test_every_cited_repo_path_exists():
    files = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".md") and p.is_file()
             and not any(part in (".venv", ".git", "migrate_corpus", "build") or part.endswith(".egg-info")
                         for part in p.relative_to(ROOT).parts)]
    missing, outside = [], []
    for f in files:
        text = f.read_text(errors="replace")
        for m in CITATION.finditer(text):
            path = re.sub(r"^vf/(models|trainer|commands|environments)/", r"\1/", m.group(1))  # installed names
            if not (ROOT / path).exists() and "my_env" not in path:
                missing.append(f"{f.relative_to(ROOT)}: {m.group(1)}")
        for bad in ("DESIGN §", "reference/peers", "reference/verifiers", "reference/prime-rl"):
            if bad in text and f.name != Path(__file__).name:
                outside.append(f"{f.relative_to(ROOT)}: cites {bad!r} (outside this repository)")
    assert not missing and not outside, "\n".join(missing + outside)


@pytest.mark.parametrize("name", ["vf", "vf-eval", "vf-serve", "vf-migrate"])
def test_version_everywhere(name):
    from vf.version import __version__, git_commit

    p = run_cli(name, "--version", check=True)
    assert p.stdout.startswith(f"vf {__version__}")
    if git_commit():
        assert git_commit()[:12] in p.stdout
