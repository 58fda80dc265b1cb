"""Rewrite old command lines in shell scripts, Makefiles, YAML workflows and Python subprocess calls.

A `vf-eval` call is classified by its flags, not its name (the name meant the v0 program before):
v0 flags (`-a`, `-s`, `-R`, `-b`, `-k`, `-T`, `-S`, ...) or verifiers 0.4.0 dotted flags
(`--env.taskset.*`, `--client.*`, `@ file.toml`) are rewritten to our flags; a call that only uses
flags we share is left alone. Commands with no vf equivalent get a `# TODO(vf-migrate)` comment
on their line. Lines are rewritten in place; a backslash-continued command is joined onto one line
only when it changes.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from vf.migrate.report import INFO, MANUAL, MIGRATED, Report
from vf.trainer.defaults import IPO_EPS

TODO = "TODO(vf-migrate)"

REMOVED = {
    "vf-install": "vf-install is gone; pip install -e the environment package, or pass the module path to vf-eval",
    "vf-tui": "vf-tui is gone; read summary.json / traces.jsonl of the run dir (vf-eval --score DIR --json)",
    "vf-setup": "vf-setup is gone; no setup step is needed",
    "vf-build": "vf-build is gone; build the package with pip/uv",
    "vf-gepa": "vf-gepa has no vf equivalent",
    "vf-debug": "vf-debug has no vf equivalent; vf-eval -n 1 -o DIR and read traces.jsonl",
    "serve": "`serve` (verifiers 0.2 env server) is gone; vf runs envs in-process",
    "uv run sft": "prime-rl SFT → vf-train --loss sft --data RUN_DIR (a run dir of traces to imitate); its "
                  "dataset config has no automatic conversion",
}
# v0 flags → (our flag or None to drop, takes a value, note)
V0_FLAGS = {
    "-b": ("--base-url", True), "--api-base-url": ("--base-url", True),
    "-k": ("--api-key-var", True), "--api-key-var": ("--api-key-var", True),
    "-t": ("--sampling.max-tokens", True), "--max-tokens": ("--sampling.max-tokens", True),
    "-T": ("--sampling.temperature", True), "--temperature": ("--sampling.temperature", True),
    "--num-examples": ("-n", True), "--rollouts-per-example": ("-r", True),
    "--max-concurrent": ("-c", True), "--timeout": ("--episode-timeout", True),
    "--shuffle-seed": ("--select.seed", True),
    "-s": (None, False), "--save-results": (None, False), "--save-dataset": (None, False),
    "-f": (None, True), "--save-every": (None, True),
    "-d": (None, False), "--disable-tui": (None, False), "-A": (None, False), "--abbreviated-summary": (None, False),
    "-v": (None, False), "--verbose": (None, False), "--fullscreen": (None, False),
    "-i": (None, False), "--independent-scoring": (None, False), "-N": (None, False),
    "--no-interleave-scoring": (None, False), "--disable-env-server": (None, False),
}
# what replaces a v0 flag vf has no spelling for (said in the report, never dropped silently)
V0_REPLACED = {
    "-s": "vf-eval always saves the run: -o DIR holds traces.jsonl (every rollout) and summary.json",
    "--save-results": "vf-eval always saves the run: -o DIR holds traces.jsonl (every rollout) and summary.json",
    "--save-dataset": "vf-eval always saves the run: -o DIR holds traces.jsonl (every rollout, the dataset rows in "
                      "each episode's task) and summary.json",
    "-f": "vf-eval writes every episode as it finishes (traces.jsonl); --resume DIR continues",
    "--save-every": "vf-eval writes every episode as it finishes (traces.jsonl); --resume DIR continues",
    "-H": "no hub upload: push RUN_DIR/traces.jsonl yourself (e.g. `huggingface-cli upload`)",
    "--save-to-hf-hub": "no hub upload: push RUN_DIR/traces.jsonl yourself (e.g. `huggingface-cli upload`)",
    "-D": "no hub upload: push RUN_DIR/traces.jsonl yourself (e.g. `huggingface-cli upload`)",
    "--hf-hub-dataset-name": "no hub upload: push RUN_DIR/traces.jsonl yourself (e.g. `huggingface-cli upload`)",
}
V0_MANUAL = {"-p": True, "--provider": True, "-e": True, "--endpoints-path": True, "-C": True,
             "--state-columns": True, "-H": False, "--save-to-hf-hub": False, "-D": True,
             "--api-client-type": True, "--header": True, "-w": True, "--num-workers": True,
             "--max-retries": True, "--heartbeat-url": True, "--env-dir-path": True}
V0_MARKERS = set(V0_FLAGS) | set(V0_MANUAL) | {"-a", "--env-args", "-x", "--extra-env-kwargs", "-S",
                                               "--sampling-args", "-R", "--shuffle"} - {"-v", "--verbose"}
V1_DOTTED = {"--env.taskset.": "--taskset.", "--taskset.": "--taskset."}
V1_MAP = {"--client.base-url": "--base-url", "--client.api-key-var": "--api-key-var", "--select.limit": "-n",
          "--num-rollouts": "-r", "--num-tasks": "-n", "--num-examples": "-n", "--max-concurrent": "-c",
          "--env.agent.max-turns": "--max-turns", "--max-turns": "--max-turns",
          "--env.agent.timeout.rollout": "--episode-timeout", "--env.timeout.episode": "--episode-timeout",
          "--output-dir": "-o", "--run.dir": "-o"}
V1_DROP = {"--no-push": False, "--push": False, "--no-rich": False, "-v": False, "--verbose": False,
           "--clean": False, "--dry-run": False}
OURS = {"-m", "--model", "--base-url", "--api-key-var", "-n", "--num-tasks", "-r", "--rollouts", "-c", "--concurrency",
        "--max-turns", "-o", "--output", "--config", "--resume", "--score", "--json", "--min-reward", "-h", "--help"}
SEPARATORS = {";", "&&", "||", "|", "&"}
PRIME_EVAL = ("prime env eval", "prime eval run", "prime eval")
"""The prime CLI's evaluation commands: they run verifiers' vf-eval, with its flags."""
PRIME_EVAL_OTHER = {"tui", "list", "ls", "view", "get", "logs", "push", "pull", "stop", "delete", "samples"}
"""`prime eval SUBCOMMAND`s that are not a run (left alone)."""
PRIME_ONLY = {"--skip-upload": (INFO, False, "vf-eval uploads nothing; the run dir is local"),
              "--hosted": (MANUAL, False, "a hosted evaluation ran on Prime's platform; vf-eval runs here"),
              "--follow": (INFO, False, "vf-eval runs in the foreground")}
CMD_RE = re.compile(r"(?:(?<=^)|(?<=[\s;&|(`'\"]))(prime\s+env\s+eval|prime\s+eval\s+run|prime\s+eval|"
                    r"uv run eval|uv run rl|vf-eval|vf-vllm|vf-rl|vf-train|prime-rl|vf-replay|eval|"
                    + "|".join(re.escape(k) for k in REMOVED) + r")(?=\s|$|['\"])")


def _yaml_scalar(value) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else (
        "true" if value is True else "false" if value is False else "null" if value is None else str(value))


def _strip_v1(taskset: str) -> str:
    return taskset.removesuffix("-v1")


def rewrite_argv(argv: list[str], notes: list[tuple[str, str, str]]) -> list[str] | None:
    """New argv for one command (argv[0] is the command), or None when nothing changes.
    `notes` collects (rule, status, message)."""
    cmd = argv[0]
    if cmd in PRIME_EVAL:
        return _rewrite_prime(argv, notes)
    if cmd in REMOVED or (cmd in ("validate", "debug", "gepa") and len(argv) > 1):
        notes.append(("SCR900", MANUAL, REMOVED.get(cmd, f"`{cmd}` (verifiers v1 v0.2-0.3) has no vf equivalent")))
        return None
    if cmd == "vf-replay":
        notes.append(("SCR005", MIGRATED, "vf-replay → vf-eval --score"))
        return ["vf-eval", "--score", *[a for a in argv[1:] if not a.startswith("-")][:1]]
    if cmd == "vf-vllm":
        out, i, dropped = ["vf-serve"], 1, []
        while i < len(argv):
            a = argv[i]
            if a in ("--model", "-m", "--port", "--host"):
                out += [a, argv[i + 1]] if i + 1 < len(argv) else [a]
                i += 2
                continue
            dropped.append(a)
            i += 1
        notes.append(("SCR003", MIGRATED, "vf-vllm → vf-serve"))
        if dropped:
            notes.append(("SCR003", MANUAL, f"vLLM options dropped: {' '.join(dropped)}; set them on vf-serve if it has them"))
        return out
    if cmd in ("vf-rl", "prime-rl", "uv run rl") or (cmd == "vf-train" and "@" in argv):
        configs = [a for a in argv[1:] if a.endswith(".toml")]
        out = ["vf-train", *[c[:-5] + ".yaml" for c in configs]]
        notes.append(("SCR004", MIGRATED, f"{cmd} → vf-train (config migrated by CFG004; the default loss is now "
                      f"IPO with eps {IPO_EPS:g}, the migrated config states it)"))
        extra = [a for a in argv[1:] if a != "@" and not a.endswith(".toml")]
        if extra:
            notes.append(("SCR004", MANUAL, f"trainer flags not carried over: {' '.join(extra)}"))
        return out
    if cmd in ("eval", "uv run eval"):
        return _rewrite_v1(argv, notes, force=True)
    if cmd == "vf-eval":
        flags = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("-")}
        if "@" in argv or any(f.startswith(("--env.", "--client.", "--select.limit", "--run.")) for f in flags) \
                or flags & {"--num-rollouts", "--no-push", "--dry-run", "--clean"}:
            return _rewrite_v1(argv, notes)
        if flags & V0_MARKERS or any(a.endswith(".toml") for a in argv[1:]):
            return _rewrite_v0(argv, notes)
        return None
    return None


def _rewrite_prime(argv, notes):
    """`prime env eval ENV ...` / `prime eval [run] ENV ...`: verifiers' vf-eval behind the prime CLI,
    with its flags → `vf-eval ENV` with ours (the flags as a verifiers vf-eval call of them)."""
    rest = []
    for a in argv[1:]:
        flag = a.split("=", 1)[0]
        if flag in PRIME_ONLY:
            status, _, why = PRIME_ONLY[flag]
            notes.append(("SCR001", status, f"{flag} dropped: {why}"))
        else:
            rest.append(a)
    inner: list = []
    new = rewrite_argv(["vf-eval", *rest], inner)
    notes.extend(inner)
    notes.append(("SCR001", MIGRATED, f"`{argv[0]}` (prime CLI: verifiers' vf-eval) → vf-eval"))
    if not any(a.split("=", 1)[0] in ("-b", "--api-base-url", "--base-url", "--client.base-url") for a in rest):
        notes.append(("SCR001", MANUAL, f"`{argv[0]}` without -b called Prime Inference; vf-eval without --base-url "
                      "runs the embedded engine: pass --base-url URL --api-key-var VAR for that endpoint"))
    return new if new is not None else ["vf-eval", *rest]


def _rewrite_v0(argv, notes):
    out = ["vf-eval"]
    i = 1
    while i < len(argv):
        a = argv[i]
        flag, eq, inline = a.partition("=")
        nxt = lambda: inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        step = 1 if eq else 2
        if not a.startswith("-"):
            if a.endswith(".toml"):
                out += ["--config", a[:-5] + ".yaml"]
                notes.append(("SCR001", MIGRATED, f"{a} → --config {a[:-5]}.yaml (migrated by CFG001; one YAML per [[eval]])"))
            else:
                out.append(a)
            i += 1
            continue
        if flag in ("-a", "--env-args", "-S", "--sampling-args", "-x", "--extra-env-kwargs"):
            raw = nxt()
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                notes.append(("SCR001", MANUAL, f"{flag} {raw!r} is not literal JSON; pass each key as --taskset.KEY VALUE"))
                out += [a] if eq else [a, raw]
                i += step
                continue
            for k, v in obj.items():
                if flag in ("-a", "--env-args"):
                    out += [f"--taskset.{k}", _yaml_scalar(v)]
                elif flag in ("-S", "--sampling-args"):
                    out += [f"--sampling.{k.replace('_', '-')}", _yaml_scalar(v)]
                elif k == "max_turns":
                    out += ["--max-turns", str(v)]
                else:
                    notes.append(("SCR001", MANUAL, f"{flag} key {k!r} has no vf flag"))
            i += step
            continue
        if flag in ("-R", "--resume"):
            if not eq and (i + 1 >= len(argv) or argv[i + 1].startswith("-")):
                notes.append(("SCR001", MANUAL, "-R without a path auto-detected the run; pass --resume RUN_DIR"))
                i += 1
                continue
            out += ["--resume", nxt()]
            i += step
            continue
        if flag == "--shuffle":
            out += ["--select.shuffle", "true"]
            i += 1
            continue
        if flag in V0_FLAGS:
            new, takes = V0_FLAGS[flag]
            if new:
                out += [new, nxt()]
            elif flag in V0_REPLACED:
                notes.append(("SCR001", INFO, f"{flag} dropped: {V0_REPLACED[flag]}"))
            i += (step if takes else 1)
            continue
        if flag in V0_MANUAL:
            hint = f": {V0_REPLACED[flag]}" if flag in V0_REPLACED else ""
            notes.append(("SCR001", MANUAL, f"v0 flag {flag} has no vf equivalent (dropped){hint}"))
            i += (step if V0_MANUAL[flag] else 1)
            continue
        if flag == "-o" or flag == "--output-dir":
            out += ["-o", nxt()]
            notes.append(("SCR001", INFO, "-o is now the run dir itself (v0: a base for evals/...)"))
            i += step
            continue
        out.append(a)
        i += 1
    notes.append(("SCR001", MIGRATED, "v0 vf-eval flags → vf flags"))
    return out


def _rewrite_v1(argv, notes, force=False):
    out = ["vf-eval"]
    i = 1
    changed = force
    run_name = None
    while i < len(argv):
        a = argv[i]
        flag, eq, inline = a.partition("=")
        nxt = lambda: inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        step = 1 if eq else 2
        if a == "@":
            cfg = argv[i + 1] if i + 1 < len(argv) else ""
            if cfg.endswith("eval.json") and "--resume" in argv:
                out += ["--resume", str(Path(cfg).parent.parent.parent if "resolved" in cfg else Path(cfg).parent.parent)]
            else:
                out += ["--config", re.sub(r"\.toml$", ".yaml", cfg)]
            changed = True
            i += 2
            continue
        if not a.startswith("-"):
            new = _strip_v1(a)
            changed |= new != a
            out.append(new)
            i += 1
            continue
        if flag == "--resume" and "@" in argv:
            i += 1
            continue
        if flag == "-s" or flag == "--select.shuffle":
            out += ["--select.shuffle", "true"]
            changed = True
            i += 1 if flag == "-s" or eq else (2 if i + 1 < len(argv) and not argv[i + 1].startswith("-") else 1)
            continue
        if flag == "--run.name":
            run_name = nxt()
            changed = True
            i += step
            continue
        if flag == "--env.taskset.id":
            out.append(_strip_v1(nxt()))
            changed = True
            i += step
            continue
        prefix = next((p for p in V1_DOTTED if flag.startswith(p)), None)
        if prefix:
            out += [V1_DOTTED[prefix] + flag[len(prefix):], nxt()]
            changed |= prefix != "--taskset."
            i += step
            continue
        if flag in V1_MAP:
            out += [V1_MAP[flag], nxt()]
            changed |= V1_MAP[flag] != flag
            i += step
            continue
        if flag in V1_DROP or flag.startswith("--rich."):
            changed = True
            i += 1 if flag in V1_DROP else step
            continue
        if flag.startswith(("--env.", "--harness.", "--client.", "--run.")):
            notes.append(("SCR002", MANUAL, f"{flag} has no vf flag (dropped)"))
            changed = True
            i += step
            continue
        out.append(a)
        i += 1
    if run_name:
        if "-o" in out:
            k = out.index("-o")
            out[k + 1] = f"{out[k + 1].rstrip('/')}/{run_name}"
        else:
            out += ["-o", f"outputs/{run_name}"]
    if not changed:
        return None
    notes.append(("SCR002", MIGRATED, f"{argv[0]} (verifiers v1) flags → vf-eval flags"))
    return out


def _quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def rewrite_command_text(text: str, notes: list) -> str | None:
    """Rewrite every old command inside one logical shell line; None when nothing changes."""
    if TODO in text:
        return None
    out, pos, changed, todo = [], 0, False, None
    for m in CMD_RE.finditer(text):
        if m.start() < pos:
            continue
        start = m.start()
        # the command runs to the next unquoted separator
        try:
            lexer = shlex.shlex(text[m.end():], posix=True, punctuation_chars=";&|()")
            lexer.whitespace_split = True
            tokens = []
            consumed = 0
            for tok in lexer:
                if tok in SEPARATORS or tok in ("(", ")") or tok.startswith(("#", ";", "&", "|", ")")):
                    break
                tokens.append(tok)
            end = len(text)
            if tokens:
                # locate the end of the last token in the raw text
                raw_tail = text[m.end():]
                cut = re.search(r"(\s*(;|&&|\|\||\||&|\)|`|#|$))", raw_tail)
                consumed = cut.start() if cut else len(raw_tail)
                end = m.end() + consumed
            else:
                end = m.end()
        except ValueError:
            continue
        name = " ".join(m.group(1).split())
        if name == "prime eval" and (not tokens or tokens[0] in PRIME_EVAL_OTHER):
            continue
        if name == "eval" and not (tokens and re.fullmatch(r"[a-z0-9][a-z0-9_.:-]*", tokens[0])
                                   and any(t.startswith("-") for t in tokens)):
            continue
        argv = ([name] if name != "uv run eval" else ["uv run eval"]) + tokens
        local: list = []
        new = rewrite_argv(argv, local)
        notes.extend(local)
        if new is None and any(s == MANUAL for _, s, _ in local) and argv[0] in REMOVED | {"validate": 1, "debug": 1, "gepa": 1}:
            todo = local[0][2]
        if new is not None:
            out.append(text[pos:start] + _quote(new))
            pos = end
            changed = True
    if not changed and not todo:
        return None
    out.append(text[pos:])
    new = "".join(out)
    if todo:
        new = new.rstrip("\n") + f"  # {TODO}: {todo}" + ("\n" if text.endswith("\n") else "")
    return new


def migrate_text_file(path: Path, source: str) -> Report:
    """Shell scripts, Makefiles and YAML workflows: rewrite each logical line."""
    report = Report()
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        start = i
        logical = lines[i]
        while logical.rstrip("\n").endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical.rstrip("\n")[:-1].rstrip() + " " + lines[i].lstrip()
        i += 1
        if logical.lstrip().startswith("#"):
            out.extend(lines[start:i])
            continue
        notes: list = []
        new = rewrite_command_text(logical, notes)
        for rule, status, msg in notes:
            report.add(path, start + 1, rule, status, msg)
        out.append(new if new is not None else "".join(lines[start:i]))
    report.change(path, source, "".join(out))
    return report


def migrate_python_subprocess(path: Path, source: str) -> Report:
    """Python files: string-list argv and command strings passed to subprocess/os.system."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    report = Report()
    if not CMD_RE.search(source):
        return report
    wrapper = MetadataWrapper(cst.parse_module(source))
    pos = wrapper.resolve(PositionProvider)

    RUNNERS = {"run", "call", "check_call", "check_output", "Popen", "system", "popen", "create_subprocess_exec",
               "create_subprocess_shell", "getoutput", "getstatusoutput"}

    class T(cst.CSTTransformer):
        # Only literals inside subprocess/os.system-style calls are commands; other strings (docs,
        # messages, rule tables) are left alone.
        depth = 0

        def visit_Call(self, node):
            f = node.func
            name = f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""
            if name in RUNNERS:
                self.depth += 1
            return True

        def leave_Call(self, original, updated):
            f = original.func
            name = f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""
            if name in RUNNERS:
                self.depth -= 1
            return updated

        def leave_List(self, original, updated):
            if not self.depth:
                return updated
            els = updated.elements
            if not els or not all(isinstance(e.value, cst.SimpleString) for e in els):
                return updated
            argv = [e.value.evaluated_value for e in els]
            if not CMD_RE.fullmatch(argv[0]) and argv[:3] != ["uv", "run", "eval"]:
                return updated
            if argv[:3] == ["uv", "run", "eval"]:
                argv = ["uv run eval", *argv[3:]]
            notes: list = []
            new = rewrite_argv(argv, notes)
            line = pos[original].start.line if original in pos else 0
            for rule, status, msg in notes:
                report.add(path, line, rule, status, msg)
            if new is None:
                return updated
            return updated.with_changes(elements=[cst.Element(cst.SimpleString(json.dumps(a)),
                                                              comma=cst.MaybeSentinel.DEFAULT) for a in new])

        def leave_SimpleString(self, original, updated):
            if not self.depth:
                return updated
            try:
                value = updated.evaluated_value
            except Exception:  # noqa: BLE001 - bytes/odd literals: leave them
                return updated
            if not isinstance(value, str) or not CMD_RE.match(value.strip()) or " " not in value.strip():
                return updated
            notes: list = []
            new = rewrite_command_text(value, notes)
            line = pos[original].start.line if original in pos else 0
            for rule, status, msg in notes:
                report.add(path, line, rule, status, msg)
            return updated if new is None or TODO in new else cst.SimpleString(json.dumps(new))

    new_source = wrapper.module.visit(T()).code
    report.change(path, source, new_source)
    return report
