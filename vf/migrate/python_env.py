"""libcst codemod: a v0 environment module (`load_environment()` on `import verifiers`) → a v1
taskset module on `import vf`.

The original code is kept, never executed here: module-level helpers and reward functions stay
as they are (their `verifiers` names now resolve to `vf.migrate.compat`), `load_environment`'s
body moves into `Taskset.load()` (dataset building) and `_v0_env()` (the statements the parser,
rubric and env options need, found by a backward slice). Generated around them: a TaskData and a
TasksetConfig (from the function's keyword parameters), a Task with @vf.stop / @vf.reward /
@vf.metric methods, a Toolset for ToolEnv tools, and a MultiTurnAdapter for env_response.
Whatever has no mechanical form is kept and marked `# TODO(vf-migrate): ...` (rule ENV900).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from vf.migrate.compat import SUPPORTED
from vf.migrate.report import INFO, MANUAL, MIGRATED, Report
from vf.migrate.v0_api import INERT_SIGNALS, TRAINING

ENV_KINDS = {"SingleTurnEnv": "single", "MultiTurnEnv": "multi", "ToolEnv": "tool", "Environment": "multi",
             "StatefulToolEnv": "tool", "SandboxEnv": "tool", "PythonEnv": "tool", "MCPEnv": "tool",
             "CliAgentEnv": "agent"}
SANDBOX_TOOLS = {"SandboxEnv": ("SandboxTools", "bash"), "PythonEnv": ("PythonTools", "python")}
"""verifiers' sandbox envs → the compat toolset whose tool runs in the rollout's runtime (ENV015)."""
SANDBOX_OPTIONS = ("timeout_per_command_seconds", "environment_vars")
"""SandboxEnv options the compat tools follow; the container's own (docker_image, cpu_cores, ...) are
the run's runtime settings in vf."""
RUNTIME_ENVS = {
    "EnvGroup": "vf.EnvGroup → compat.EnvGroup run by compat.V0Taskset: one taskset of every member's rows, each "
                "with info['env_id'] = its member, scored by that member's rubric (v0's reward)",
    "TextArenaEnv": "TextArenaEnv → compat.TextArenaEnv run by compat.V0Taskset: Wordle-v0 is played by vf "
                    "(vf's word list and G/Y/X rules, textarena's reply layout); other textarena games are an error",
    "ReasoningGymEnv": "ReasoningGymEnv → compat.ReasoningGymEnv run by compat.V0Taskset: reasoning-gym's generated "
                       "rows and its score_answer on the <answer> field, as v0 built them (needs reasoning-gym)",
    "GymEnv": "GymEnv → compat.GymEnv run by compat.V0Taskset: one game per row (reset with the row's seed), each reply "
              "parsed into an action and stepped until the game is done; v0's rubric sums the step rewards",
    "HarborEnv": "HarborEnv → compat.HarborEnv run by compat.HarborTaskset: one row per Harbor task folder, run_command "
                 "the seat's program harness in the task's /app, then the task's tests/test.sh in fresh /tests and "
                 "/logs/verifier; v0's harbor_reward reads reward.txt / reward.json (needs the sandbox or docker runtime)",
}
"""v0 envs vf-migrate keeps building at load time (compat.V0Taskset) instead of rewriting."""
RUNTIME_MULTI_TURN = {"TextArenaEnv", "GymEnv"}
"""RUNTIME_ENVS whose rollouts are multi-turn games (compat.MultiTurnAdapter runs their env_response)."""
CLI_AGENT_HOOKS = ("post_sandbox_setup", "build_env_vars", "get_docker_image", "get_sandbox_resources", "start_agent",
                   "post_rollout", "destroy_sandbox", "wait_for_completion", "get_sandbox_request")
"""v0 CliAgentEnv methods a subclass overrides to drive its Prime sandbox (ENV017 flags them)."""
SANDBOX_HOOKS = ("build_env_vars", "post_sandbox_setup")
"""The two CliAgentEnv sandbox hooks vf runs before the agent (compat.sandbox_setup), their
`self.sandbox_client` on the rollout's runtime."""
HARBOR_HOOKS = (*(h for h in CLI_AGENT_HOOKS if h not in SANDBOX_HOOKS), "prepare_harbor_task", "upload_test_assets",
                "compute_reward", "pre_mcp_setup", "start_mcp_servers")
"""v0 HarborEnv methods a subclass overrides that compat.HarborTaskset does not call (it calls the
SANDBOX_HOOKS, `harbor_reward` and `load_harbor_dataset`)."""
LIBRARY_ENVS = {
    name: f"verifiers' {name} ({what}) has no compat class yet: migrated as a multi-turn env without its tools or "
          f"services; port it to {port}"
    for name, what, port in (
        ("BrowserEnv", "a Browserbase-hosted browser driven through tools, 0.1.10+", "a vf.Toolset whose tools "
         "call the browser service (it needs the service's network and key)"),
        ("OpenEnvEnv", "an OpenEnv server in a container, stepped through its HTTP API, 0.1.10+", "a vf.Env whose "
         "respond() steps the OpenEnv client (the server runs where --env.agent.runtime.type docker can start it)"),
        ("CodeMathEnv", "0.1.0-0.1.1 only, before load_environment modules", "a ToolEnv with the python tool"),
        ("DoubleCheckEnv", "0.1.0-0.1.1 only, before load_environment modules", "a MultiTurnEnv asking "
         "'Are you sure?'"),
        ("SmolaToolEnv", "smolagents tools, 0.1.0-0.1.1 only", "a vf.Toolset calling the tools"),
    )
}
"""verifiers' library env classes vf-migrate does not map yet: the TODO names what each did and the v1
construct it ports to (the mapped ones are RUNTIME_ENVS, SANDBOX_TOOLS and MCPEnv)."""
INERT_NOTE = ("{names} kept as v0 had it, without effect: verifiers 0.1.14-0.3.x export these for verifiers.v1's "
              "Taskset/Harness, and a v0 Environment or Rubric never ran them, so v0's rewards did not include "
              "them; to score with one, make it a @vf.reward/@vf.metric method of the migrated Task")


class _GroupFunctions(cst.CSTTransformer):
    """Flags v0 group reward functions (plural arguments) with a TODO; records (line, name)."""

    def __init__(self, line: Callable[[cst.CSTNode], int]):
        self.line, self.found = line, []

    def leave_FunctionDef(self, original, updated):
        params = {p.name.value for p in [*updated.params.params, *updated.params.kwonly_params]}
        if not params & PLURAL or updated.name.value == "load_environment":  # its `tasks` picks rows
            return updated
        self.found.append((self.line(original), updated.name.value))
        return _flag(updated, f"{updated.name.value} is a group reward (plural arguments): compat.V0Taskset "
                              "scores one rollout at a time; port it to Env.finalize (see ENV012)")


def _env_name(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
DATA_ARGS = ("dataset", "eval_dataset", "system_prompt", "few_shot")
V0_PACKAGES = ("verifiers", "verifiers.legacy")
"""`import verifiers as vf`, and verifiers 0.3.x's home of the same v0 API: `import verifiers.legacy as vf`."""
TASK_ATTRS = {"setup", "finalize", "validate", "messages", "hooks", "data", "config", "toolsets"}
PLURAL = {"completions", "prompts", "answers", "infos", "states", "tasks"}
TODO = "TODO(vf-migrate)"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _inline(node: cst.CSTNode) -> str:
    """`node`'s code for a one-line context (a class field, an assignment): an expression that
    spans lines inside the original brackets (`str\n    | None`) gets brackets of its own."""
    code = _code(node)
    return f"({code})" if "\n" in code else code


def _camel(stem: str) -> str:
    return "".join(p.capitalize() for p in re.split(r"[^0-9a-zA-Z]+", stem) if p) or "Migrated"


class _Names(cst.CSTVisitor):
    """Names read by a node (over-approximate: attribute bases, not attribute or keyword names)."""

    def __init__(self):
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def used_names(node: cst.CSTNode) -> set[str]:
    v = _Names()
    node.visit(v)
    return v.names


class _Defs(cst.CSTVisitor):
    def __init__(self):
        self.names: set[str] = set()

    def _targets(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            self.names.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for el in node.elements:
                self._targets(el.value)

    def visit_AssignTarget(self, node):
        self._targets(node.target)

    def visit_AnnAssign(self, node):
        self._targets(node.target)

    def visit_AugAssign(self, node):
        self._targets(node.target)

    def visit_For(self, node):
        self._targets(node.target)

    def visit_FunctionDef(self, node):
        self.names.add(node.name.value)
        return False

    def visit_ClassDef(self, node):
        self.names.add(node.name.value)
        return False

    def visit_ImportAlias(self, node):
        name = node.asname.name if node.asname else node.name
        if isinstance(name, cst.Name):
            self.names.add(name.value)
        else:
            self.names.add(_code(name).split(".")[0])

    def visit_Expr(self, node):
        # `rubric.add_reward_func(f)` mutates `rubric`: treat it as a (re)definition
        call = node.value
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
            base = call.func.value
            while isinstance(base, cst.Attribute):
                base = base.value
            if isinstance(base, cst.Name):
                self.names.add(base.value)


def defined_names(stmt: cst.CSTNode) -> set[str]:
    v = _Defs()
    stmt.visit(v)
    return v.names


class _Rename(cst.CSTTransformer):
    """`<alias>.X` → `compat.X`; records the v0 names compat lacks."""

    def __init__(self, aliases: set[str]):
        self.aliases = aliases
        self.unknown: set[str] = set()
        self.inert: set[str] = set()  # v0 markers that change nothing on v0 classes (ENV014)

    def leave_ImportFrom(self, original, updated):
        """`from verifiers[.sub] import X` inside a function → `from vf.migrate.compat import X`."""
        if not _is_verifiers_from(updated):
            return updated
        self.unknown |= set(_missing_names(updated))
        return _to_compat(updated)

    def leave_Attribute(self, original, updated):
        if isinstance(updated.value, cst.Name) and updated.value.value in self.aliases:
            if updated.attr.value not in SUPPORTED:
                self.unknown.add(updated.attr.value)
            if updated.attr.value in INERT_SIGNALS:
                self.inert.add(updated.attr.value)
            return updated.with_changes(value=cst.Name("compat"))
        return updated


def _flag(stmt, message: str):
    comment = cst.EmptyLine(comment=cst.Comment(f"# {TODO}: {message}"))
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, comment])


def _is_docstring(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


@dataclass
class _Func:
    index: int
    name: str
    weight: str
    metric: bool
    line: int
    group: bool = False  # plural arguments: scored over a group of traces, in Env.finalize


@dataclass
class _Plan:
    funcs: list[_Func] = field(default_factory=list)
    manual: list[tuple[int, str]] = field(default_factory=list)
    judge: dict[str, str] | None = None  # JudgeRubric settings: model / prompt expressions
    setup_state: bool = False  # the v0 env class defines setup_state
    stateful: bool = False  # StatefulToolEnv: tool calls get arguments from the state
    skip: dict[str, list[str]] = field(default_factory=dict)  # tool → args_to_skip


def is_v0_environment(source: str) -> bool:
    """Cheap textual check before parsing: defines load_environment and imports verifiers."""
    return bool(re.search(r"^def load_environment\(", source, re.MULTILINE)
                and re.search(r"^\s*(import verifiers|from verifiers)", source, re.MULTILINE))


def imports_verifiers(source: str) -> bool:
    """Cheap textual check: a module-level `import verifiers` / `from verifiers...`."""
    return bool(re.search(r"^(import verifiers|from verifiers)\b", source, re.MULTILINE))


def migrate_helper(path: Path, source: str) -> Report:
    """A module importing verifiers without load_environment() (`_Migration.run_helper`); one the
    codemod cannot handle is reported and left as it is."""
    try:
        report = _Migration(path, source).run_helper()
        compile(report.changes[-1].new, str(path), "exec")
        return report
    except Exception as e:  # noqa: BLE001 - keep the file, say why
        report = Report()
        report.add(path, 1, "ENV900", MANUAL, f"imports verifiers; not migrated ({type(e).__name__}: {e}): port it")
        return report


UNMIGRATED = f"# {TODO}: vf-migrate could not migrate this module"


def migrate_environment(path: Path, source: str) -> Report:
    """Rewrite one v0 environment module; the Report holds the change and its entries.

    Never raises on a file Python can parse, and never writes code that does not compile: a
    module the codemod cannot handle is kept as it is under a `TODO(vf-migrate)` header that
    says why (rule ENV900), which a later run recognises and leaves alone."""
    if UNMIGRATED in source:
        report = Report()
        report.add(path, 1, "ENV900", MANUAL, "marked earlier as not migratable; port it by hand")
        return report
    try:
        try:
            report = _migrate_environment(path, source)
        except cst.ParserSyntaxError:
            report = _migrate_reparsed(path, source)  # SyntaxError here: Python cannot parse it either
        new = report.changes[-1].new if report.changes else None
        if new is not None:
            compile(new, str(path), "exec")
        return report
    except MigrationError as e:
        reason = str(e).removeprefix(f"{path}: ")
    except SyntaxError as e:
        reason = f"the generated code would not compile ({e.msg}, line {e.lineno})"
    except Exception as e:  # noqa: BLE001 - any codemod failure: keep the module, flag it
        reason = f"the codemod failed ({type(e).__name__}: {e})"
    return unmigrated(path, source, reason)


def _migrate_reparsed(path: Path, source: str) -> Report:
    """Migrate a module libcst cannot parse but Python can: from Python's own parse of it
    (`ast.unparse`), so the same code is migrated; comments and layout are not kept, and the
    report says so (the original stays as .bak)."""
    import ast

    normalised = ast.unparse(ast.parse(source)) + "\n"
    report = _migrate_environment(path, normalised)
    for c in report.changes:
        if c.path == path:
            c.old = source
    report.add(path, 1, "ENV001", INFO, "libcst could not parse this module (Python can): migrated from Python's own "
               "parse of it, so its comments and formatting were not kept (the original is NAME.bak)")
    return report


def unmigrated(path: Path, source: str, reason: str) -> Report:
    """`source` kept as it is under a TODO(vf-migrate) header that says why (rule ENV900)."""
    lines = source.splitlines(keepends=True)
    head = 1 if lines and lines[0].startswith("#!") else 0
    if len(lines) > head and re.match(r"^#.*coding[:=]", lines[head]):
        head += 1
    reason = " ".join(reason.split())
    header = f"{UNMIGRATED}: {reason}\n"
    report = Report()
    report.add(path, 1, "ENV900", MANUAL, f"not migrated: {reason}")
    report.change(path, source, "".join(lines[:head]) + header + "".join(lines[head:]))
    return report


def _migrate_environment(path: Path, source: str) -> Report:
    return _Migration(path, source).run()


class _Migration:
    """One module's rewrite, as named steps over shared state (the report, the plan, names)."""

    def __init__(self, path: Path, source: str):
        self.path, self.source, self.report, self.plan = path, source, Report(), _Plan()
        wrapper = MetadataWrapper(cst.parse_module(source))
        self.pos = wrapper.resolve(PositionProvider)
        self.mod = wrapper.module

    def line(self, n) -> int:
        return self.pos[n].start.line if n in self.pos else 0

    def add(self, n, rule, status, msg) -> None:
        self.report.add(self.path, n if isinstance(n, int) else self.line(n), rule, status, msg)

    def fresh(self, name: str) -> str:
        while name in self.taken:
            name += "V1"
        self.taken.add(name)
        return name

    def ren(self, node):
        return node.visit(self.renamer)

    def code(self, node) -> str:
        return _code(self.ren(node))

    def run(self) -> Report:
        self.scan_module()
        self.base = _camel(self.path.stem)
        self.taken = set(self.module_names)
        self.N = {k: self.fresh(self.base + k) for k in ("Data", "Config", "Task", "Taskset")}
        self.renamer = _Rename(self.aliases)
        env_call = self.split_load_environment()
        runtime_base = self.runtime_base(_env_name(env_call))
        if runtime_base is not None:
            return self.run_at_runtime(env_call, runtime_base)
        self.env_kind(env_call)
        self.kwargs = {a.keyword.value: a for a in env_call.args if a.keyword is not None}
        self.check_env_args(env_call)
        self.plan_rewards(self.kwargs.get("rubric"))
        self.slice_env_parts(env_call)
        self.plan_tools(self.kwargs.get("tools"))
        generated = cst.parse_module(self.generate())
        gen_stmts = self.fill(list(generated.body))
        gen_stmts[0] = gen_stmts[0].with_changes(
            leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *generated.header, *gen_stmts[0].leading_lines])
        self.report.change(self.path, self.source, self.assemble(gen_stmts))
        return self.report

    def run_helper(self) -> Report:
        """A module that imports verifiers but defines no load_environment() (a helper of an env
        package, a v0 training script): its verifiers imports and names go to vf.migrate.compat
        and its code is kept, so the environment that imports it needs no verifiers; what compat
        has no twin for (GRPOTrainer, get_model_and_tokenizer, ...) is flagged (ENV900)."""
        self.scan_module(need_env=False)
        self.renamer = _Rename(self.aliases)
        body, imported_vf = [], [False, False]
        for stmt in self.mod.body:
            if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                body.extend(_rewrite_imports(stmt, self.add, self.line, imported_vf))
            else:
                body.append(self.renamed(stmt))
        self.report.change(self.path, self.source, self.mod.with_changes(body=body).code)
        return self.report

    # ---- analysis ------------------------------------------------------------------------------

    def scan_module(self, need_env: bool = True) -> None:
        """The module's top-level names, functions, classes, `verifiers` aliases and load_environment."""
        self.aliases: set[str] = set()
        self.module_names: set[str] = set()
        self.functions: dict[str, cst.FunctionDef] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self.load_env: cst.FunctionDef | None = None
        self.module_lists: dict[str, cst.List] = {}  # NAME = [...] at module level
        self.v0_imported: set[str] = set()  # names imported from verifiers.* modules
        self.openai_names: dict[str, str] = {}  # local name → OpenAI|AsyncOpenAI, imported from openai
        for stmt in self.mod.body:
            self.module_names |= defined_names(stmt)
            if isinstance(stmt, cst.FunctionDef):
                if stmt.name.value == "load_environment":
                    self.load_env = stmt
                else:
                    self.functions[stmt.name.value] = stmt
            elif isinstance(stmt, cst.ClassDef):
                self.classes[stmt.name.value] = stmt
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assign) and isinstance(small.value, cst.List) and \
                            len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                        self.module_lists[small.targets[0].target.value] = small.value
                    if isinstance(small, cst.ImportFrom) and small.module is not None and \
                            _code(small.module) == "openai" and not isinstance(small.names, cst.ImportStar):
                        self.openai_names.update({(a.asname.name if a.asname else a.name).value: a.name.value
                                                  for a in small.names if a.name.value in ("OpenAI", "AsyncOpenAI")})
                    if _is_verifiers_from(small) and not isinstance(small.names, cst.ImportStar):
                        self.v0_imported |= {(a.asname.name if a.asname else a.name).value for a in small.names}
                    if isinstance(small, cst.Import):
                        for a in small.names:
                            if _code(a.name) in V0_PACKAGES and (a.asname or _code(a.name) == "verifiers"):
                                self.aliases.add(a.asname.name.value if a.asname else "verifiers")
        assert self.load_env is not None or not need_env

    def split_load_environment(self) -> cst.Call:
        """load_environment's docstring, body statements and the environment constructor call it returns."""
        body = list(self.load_env.body.body)
        self.docstring = body.pop(0) if body and _is_docstring(body[0]) else None
        ret = body[-1] if body and isinstance(body[-1], cst.SimpleStatementLine) and isinstance(body[-1].body[0], cst.Return) else None
        env_call = env_stmt = None
        if ret is not None:
            body.pop()
            value = ret.body[0].value
            if isinstance(value, cst.Name):
                env_stmt = self._assigned_call(body, value.value)
                env_call = env_stmt.body[0].value if env_stmt is not None else None
            elif isinstance(value, cst.Call):
                env_call = value
        if env_call is None:
            raise MigrationError(f"{self.path}: load_environment() must end with `return <Env>(...)` "
                                 "(or return a variable assigned from one); migrate it by hand")
        self.env_var, self.post_env = None, []
        if env_stmt is not None:
            # statements after the env is built that use it (`vf_env.rubric = ...`) shape the env:
            # they run in _v0_env(), not in load()
            self.env_var = value.value
            after = body[body.index(env_stmt) + 1:]
            self.post_env = [s for s in after if self.env_var in used_names(s)]
            body.remove(env_stmt)
            for s in self.post_env:
                body.remove(s)
        self.body = body
        return env_call

    @staticmethod
    def _assigned_call(body: list, name: str):
        """The last statement of `body` that assigns a call's result to `name` (None: there is none)."""
        for s in reversed(body):
            if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign) and \
                    name in defined_names(s) and isinstance(s.body[0].value, cst.Call):
                return s
        return None

    def runtime_base(self, name: str) -> str | None:
        """The RUNTIME_ENVS class `name` is or derives from through classes of the module (None: neither)."""
        seen: set[str] = set()
        while name not in RUNTIME_ENVS and name in self.classes and name not in seen:
            seen.add(name)
            bases = [_code(b.value).split(".")[-1] for b in self.classes[name].bases]
            name = next((b for b in bases if b in RUNTIME_ENVS or b in self.classes), "")
        return name if name in RUNTIME_ENVS else None

    def run_at_runtime(self, env_call: cst.Call, name: str) -> Report:
        """An env whose rows and rubric only exist once it is built (RUNTIME_ENVS): keep
        load_environment() on compat's v0 classes, and wrap it in a compat.V0Taskset that builds
        it at load time and scores each row with its (member's) v0 rubric."""
        body, imported_vf = [], [False, False]
        group_fns = _GroupFunctions(self.line)
        for stmt in self.mod.body:
            if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                body.extend(_rewrite_imports(stmt, self.add, self.line, imported_vf))
            else:
                body.append(self.renamed(stmt.visit(group_fns)))
        for ln, fname in group_fns.found:
            self.add(ln, "ENV900", MANUAL, f"group reward {fname}(completions, ...) of a {name} member: "
                     "compat.V0Taskset scores one rollout at a time (it would score 0); port it to Env.finalize")
        if name == "HarborEnv":  # a subclass's sandbox hooks: vf runs none of them
            for cls_name, cls in self.classes.items():
                if self.runtime_base(cls_name) != name:
                    continue
                for item in cls.body.body:
                    if isinstance(item, cst.FunctionDef) and item.name.value in SANDBOX_HOOKS:
                        self.add(item, "ENV017", MIGRATED, f"{cls_name}.{item.name.value} → run before the agent, its "
                                 "self.sandbox_client on the rollout's runtime")
                    elif isinstance(item, cst.FunctionDef) and item.name.value in HARBOR_HOOKS:
                        self.add(item, "ENV900", MANUAL, f"{cls_name}.{item.name.value} overrides a v0 HarborEnv "
                                 "sandbox hook, which vf does not call: do its work in a Task.setup(runtime) of a "
                                 "compat.HarborTask subclass (files, commands) or the harness's environment "
                                 "(--env.agent.harness.env)")
        if not any(isinstance(s, cst.SimpleStatementLine) and _code(s).strip() == "from vf.migrate import compat"
                   for s in body):
            body.insert(0, cst.parse_statement("from vf.migrate import compat\n"))
        multi = "\n    v0_multi_turn = True" if name in RUNTIME_MULTI_TURN else ""
        base, seat = "V0Taskset", ""
        if name == "HarborEnv":  # the agent: run_command as the seat's program harness
            base, agent = "HarborTaskset", self.fresh(self.base + "Agent")
            config, env_cls = self.fresh(self.base + "EnvConfig"), self.fresh(self.base + "Env")
            seat = (f"class {agent}(compat.HarborAgent):\n"
                    f'    """The v0 HarborEnv\'s run_command, as a program harness."""\n\n'
                    f"    v0_load = staticmethod(load_environment)\n\n\n"
                    f"class {config}(vf.SingleAgentEnvConfig):\n"
                    f'    agent: vf.AgentConfig = vf.AgentConfig(harness=vf.HarnessConfig(id=f"{{__file__}}:{agent}"))\n\n\n'
                    f"class {env_cls}(vf.Env[{config}]):\n"
                    f'    """One seat, which runs {agent} unless --env.agent.harness.id says otherwise."""\n\n\n')
            multi = f"\n    ENV = {env_cls}"
            self.add(env_call, "ENV017", MIGRATED, f"HarborEnv's run_command → {agent}, the seat's default program "
                     "harness (--env.agent.harness.id picks another)")
        tail = cst.parse_module(
            f"\n\n# ---- migrated by vf-migrate (see MIGRATION.md): {name} is built at load time ----\n\n"
            f"{seat}class {self.N['Taskset']}(compat.{base}):\n"
            f'    """load_environment() on vf.migrate.compat; `--taskset.args` are its keyword arguments."""\n\n'
            f"    v0_load = staticmethod(load_environment){multi}\n\n\n"
            f'__all__ = ["{self.N["Taskset"]}"]\n')
        first = tail.body[0]
        body.append(first.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *tail.header,
                                                      *first.leading_lines]))
        body.extend(tail.body[1:])
        self.add(env_call, "ENV013", MIGRATED, RUNTIME_ENVS[name])
        self.report.change(self.path, self.source, self.mod.with_changes(body=body).code)
        return self.report

    def env_kind(self, env_call: cst.Call) -> None:
        """single / multi / tool, from the env class or the v0 subclass's bases; its setup_state and add_tool calls."""
        plan, func = self.plan, env_call.func
        env_name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        kind, self.v0_class = ENV_KINDS.get(env_name), None
        if kind is None and env_name not in self.classes:
            # a v0 env class defined inside load_environment (alphabet_sort's SortingEnv): the same
            # class, rebuilt by _v0_env() with the statements it needs
            for stmt in self.body:
                if isinstance(stmt, cst.ClassDef) and stmt.name.value not in self.classes:
                    self.classes[stmt.name.value] = stmt
        if kind is None and env_name in self.classes:
            self.v0_class = env_name
            kind = self._class_kind(env_name, set())
        # the env class and every base of it through the module's classes (nearest first)
        bases = [env_name] + ([_code(b.value).split(".")[-1] for c in self._class_chain(self.v0_class)
                               for b in self.classes[c].bases] if self.v0_class is not None else [])
        if kind is None:
            kind = "multi"
            library = next((b for b in bases if b in LIBRARY_ENVS), None)
            plan.manual.append((self.line(env_call), LIBRARY_ENVS[library] if library else
                                f"unknown environment class {env_name!r}: migrated as a multi-turn env; check it"))
        self.kind = kind
        self.sandbox = next((b for b in bases if b in SANDBOX_TOOLS), None)  # the nearest one: PythonEnv hides bash
        self.mcp = "MCPEnv" in bases
        plan.stateful = "StatefulToolEnv" in bases or self.sandbox is not None
        self.tool_names: list[str] = []
        self.sandbox_hooks = False
        if self.v0_class is not None:
            for name in self._class_chain(self.v0_class):
                self._class_tools(self.classes[name])
                if kind == "agent":  # v0 CliAgentEnv hooks that drove its Prime sandbox: vf calls two of them
                    for item in self.classes[name].body.body:
                        if isinstance(item, cst.FunctionDef) and item.name.value in SANDBOX_HOOKS:
                            self.sandbox_hooks = True
                            self.add(item, "ENV017", MIGRATED, f"{name}.{item.name.value} → run before the agent by "
                                     f"{self.N['Task']}.setup, its self.sandbox_client on the rollout's runtime")
                        elif isinstance(item, cst.FunctionDef) and item.name.value in CLI_AGENT_HOOKS:
                            plan.manual.append((self.line(item), f"{name}.{item.name.value} overrides a v0 CliAgentEnv "
                                                "sandbox hook, which vf does not call: do its work in Task.setup(runtime) "
                                                "(files, commands) or the harness's environment (--env.agent.harness.env)"))

    def _class_chain(self, name: str) -> list[str]:
        """`name` and the module classes it derives from (nearest first)."""
        chain, todo = [], [name]
        while todo:
            cur = todo.pop(0)
            if cur in chain or cur not in self.classes:
                continue
            chain.append(cur)
            todo += [getattr(b.value, "value", "") for b in self.classes[cur].bases if isinstance(b.value, cst.Name)]
        return chain

    def _class_kind(self, name: str, seen: set[str]) -> str | None:
        """single / multi / tool of a module class, through its bases (a class of this module that
        derives from vf.MultiTurnEnv is itself a v0 env class)."""
        seen.add(name)
        kind = None
        for b in self.classes[name].bases:
            bname = b.value.attr.value if isinstance(b.value, cst.Attribute) else getattr(b.value, "value", "")
            if bname in ENV_KINDS:
                kind = ENV_KINDS[bname]
            elif bname in self.classes and bname not in seen:
                kind = self._class_kind(bname, seen) or kind
        return kind

    def _class_tools(self, cls: cst.ClassDef) -> None:
        plan = self.plan
        for item in cls.body.body:
            if isinstance(item, cst.FunctionDef) and item.name.value == "setup_state":
                plan.setup_state = True
                self.add(item, "ENV009", MIGRATED, f"{self.v0_class}.setup_state → {self.N['Task']}.setup")
        for call in _calls(cls, "add_tool"):
            fn = call.args[0].value if call.args else None
            if isinstance(fn, cst.Name) and fn.value in self.functions:
                self.tool_names.append(fn.value)
                skip = next((a.value for a in call.args[1:] if a.keyword is not None
                             and a.keyword.value == "args_to_skip"), None)
                if isinstance(skip, (cst.List, cst.Tuple)):
                    plan.skip[fn.value] = [e.value.evaluated_value for e in skip.elements
                                           if isinstance(e.value, cst.SimpleString)]
            elif call.args:
                plan.manual.append((self.line(call), "add_tool() of something that is not a module-level function: "
                                    "add it to the Toolset by hand"))

    def check_env_args(self, env_call: cst.Call) -> None:
        if any(a.keyword is None and not a.star for a in env_call.args):
            self.plan.manual.append((self.line(env_call), "positional arguments to the environment constructor: "
                                     "pass them by name"))
        for k in self.kwargs:
            if k not in (*DATA_ARGS, "parser", "rubric", "tools", "max_turns", *(SANDBOX_OPTIONS if self.sandbox else ()),
                         *(("mcp_servers",) if self.mcp else ()),
                         *(("run_command", "environment_vars") if self.kind == "agent" else ())):
                self.add(env_call, "ENV900", INFO, f"environment option {k}= is kept on the compat env but vf does not use it")

    def plan_rewards(self, rubric_arg) -> None:
        """rubric= → the plan's reward/metric functions (and a judge for a JudgeRubric)."""
        rubric_call, rubric_var = None, None
        if rubric_arg is not None:
            if isinstance(rubric_arg.value, cst.Call):
                rubric_call = rubric_arg.value
            elif isinstance(rubric_arg.value, cst.Name):
                rubric_var = rubric_arg.value.value
                rubric_call = self._rubric_assigned(rubric_var)
        for s in self.post_env:  # `vf_env.rubric = X(...)` after the env was built replaces its rubric
            if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign) and \
                    _code(s.body[0].targets[0].target) == f"{self.env_var}.rubric" and isinstance(s.body[0].value, cst.Call):
                self.env_rubric = (rubric_call, rubric_var)
                rubric_call, rubric_var = s.body[0].value, None
        if rubric_call is None and rubric_arg is None and self.v0_class is not None:
            rubric_call = next((r for c in self._class_chain(self.v0_class)
                                if (r := self._class_rubric(self.classes[c])) is not None), None)
        if rubric_call is None:
            self.plan.manual.append((self.line(self.load_env), "no Rubric(...) found for rubric=: the migrated task has no rewards"))
            return
        used = set(TASK_ATTRS)
        for i, (fn, w, metric) in enumerate(self._rubric_items(rubric_call, rubric_var)):
            self._plan_func(i, fn, w, metric, used)
        if not self.plan.funcs:
            # Not a decision left to the user: every release that loads `load_environment` modules
            # (0.1.2+) scored a rubric without functions 0; only 0.1.0-0.1.1's JudgeRubric added its
            # own judge_reward_func, and those releases had no load_environment.
            judge = " (a JudgeRubric adds its judge_reward_func only in verifiers 0.1.0-0.1.1, which load no " \
                "load_environment module; add compat's rubric.judge_reward_func to score the judge)" if self.plan.judge else ""
            self.add(rubric_call, "ENV003", INFO, "the rubric has no reward functions, so v0 scored every rollout 0: "
                     "the migrated task has no rewards" + judge)

    @staticmethod
    def _class_rubric(node: cst.ClassDef):
        """`self.rubric = SomeRubric(...)` in the v0 env class's __init__ (None: there is none)."""
        init = next((f for f in node.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"), None)
        for s in init.body.body if init is not None else []:
            if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign) and \
                    _code(s.body[0].targets[0].target) == "self.rubric" and isinstance(s.body[0].value, cst.Call):
                return s.body[0].value
        return None

    def _rubric_assigned(self, name: str):
        """The last call assigned to `name` in load_environment, as v0 ran it (None: there is none)."""
        found = None
        for s in self.body:
            if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign) and \
                    name in defined_names(s) and isinstance(s.body[0].value, cst.Call):
                found = s.body[0].value
        return found

    def _rubric_items(self, rubric_call: cst.Call, rubric_var: str | None) -> list:
        """(function, weight, is_metric) in v0's scoring order: a RubricGroup's members one after
        the other, a MathRubric's `correct_answer` after its funcs, then `add_reward_func` calls."""
        rname = rubric_call.func.attr.value if isinstance(rubric_call.func, cst.Attribute) else _code(rubric_call.func)
        if rname == "RubricGroup":
            members = next((a.value for a in rubric_call.args if (a.keyword is None and not a.star)
                            or (a.keyword is not None and a.keyword.value == "rubrics")), None)
            if not isinstance(members, (cst.List, cst.Tuple)):
                self.plan.manual.append((self.line(rubric_call), "RubricGroup(rubrics=...) is not a literal list: add "
                                         "one @vf.reward per member function by hand"))
                return []
            items = []
            for el in members.elements:
                if self.env_var and _code(el.value) == f"{self.env_var}.rubric" and getattr(self, "env_rubric", None):
                    items += self._rubric_items(*self.env_rubric)  # the rubric the env was built with
                    continue
                call = el.value if isinstance(el.value, cst.Call) else \
                    self._rubric_assigned(el.value.value) if isinstance(el.value, cst.Name) else None
                if call is None:
                    self.plan.manual.append((self.line(el), f"RubricGroup member {_code(el.value)} is not a rubric "
                                             "built in load_environment: add its rewards by hand"))
                    continue
                items += self._rubric_items(call, el.value.value if isinstance(el.value, cst.Name) else None)
            self.add(rubric_call, "ENV003", MIGRATED, "RubricGroup → its members' functions, in order")
            return items + (self._added_funcs(rubric_var) if rubric_var else [])
        self._rubric_class(rubric_call, rname)
        items = self._rubric_funcs(rubric_call)
        if rname == "MathRubric":
            items.append((cst.Name("correct_answer"), "1.0", False))
            self.add(rubric_call, "ENV003", MIGRATED, "MathRubric → compat.MathRubric: correct_answer (weight 1.0), "
                     "math_verify when installed, else normalised/numeric equality")
        elif rname == "ToolRubric":
            self.add(rubric_call, "ENV003", INFO, "ToolRubric's tool-call counts were metrics (weight 0): not "
                     "migrated as rewards (v1 traces record every tool call)")
        return items + (self._added_funcs(rubric_var) if rubric_var else [])

    def _own_judge_rubric(self, rname: str) -> bool:
        """A rubric class of this module that takes a judge client (misguided_attention's own
        `JudgeRubric(vf.Rubric)`, which calls `self.judge_client.chat.completions.create`)."""
        cls = self.classes.get(rname)
        init = next((f for f in cls.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"),
                    None) if cls is not None else None
        return init is not None and any(p.name.value in ("judge_client", "client") for p in
                                        [*init.params.params, *init.params.kwonly_params])

    def _judge_unresolved(self, rubric_call: cst.Call) -> None:
        for key in self.plan.judge.pop("unresolved", []):
            self.plan.manual.append((self.line(rubric_call), f"the JudgeRubric's {key}= is computed in load_environment: "
                                     f"the migrated judge uses {'the default model' if 'model' in key else 'v0 default prompt'}"
                                     f"; set {self.base}Judge.prompt / the judge config's model to its value"))

    def _rubric_class(self, rubric_call: cst.Call, rname: str) -> None:
        if rname in self.classes and self._own_judge_rubric(rname):
            self.plan.judge = _judge_settings(rubric_call, self.load_env)
            self._judge_unresolved(rubric_call)
            self.add(rubric_call, "ENV010", MIGRATED, f"{rname} (this module's own judge rubric) keeps its judge(); "
                     f"the judge client it calls is compat.OpenAI, which reaches {self.base}Judge (a vf.Judge) on the "
                     "task config while a reward runs (model, base_url, API key variable of the v0 client; "
                     "`--env.taskset.task.judge.*` overrides)")
        elif rname == "JudgeRubric":
            self.plan.judge = _judge_settings(rubric_call, self.load_env)
            self._judge_unresolved(rubric_call)
            self.add(rubric_call, "ENV010", MIGRATED, f"JudgeRubric → {self.base}Judge (a vf.Judge) on the task config "
                     "(model, base_url, API key variable of the v0 client; `--env.taskset.task.judge.*` overrides); "
                     "the rewards' judge(...) fills v0's prompt from the judge rubric's own parser, as v0 did")
        elif rname not in ("Rubric", "MathRubric", "ToolRubric"):
            self.plan.manual.append((self.line(rubric_call), f"{rname} has no compat equivalent; port it to @vf.reward "
                                     "methods (a judge call inside a reward, or vf's math helpers)"))

    def _rubric_funcs(self, rubric_call: cst.Call) -> list[tuple[cst.BaseExpression, str, bool]]:
        """(function, weight, is_metric) from the Rubric's funcs=/weights= lists."""
        rargs = {a.keyword.value: a.value for a in rubric_call.args if a.keyword is not None}
        pos_args = [a.value for a in rubric_call.args if a.keyword is None]
        funcs = rargs.get("funcs", pos_args[0] if pos_args else None)
        weights = rargs.get("weights", pos_args[1] if len(pos_args) > 1 else None)
        if funcs is None:
            return []
        if not isinstance(funcs, cst.List):
            self.plan.manual.append((self.line(rubric_call), "funcs is not a literal list: add one @vf.reward per function"))
            return []
        wl = weights.elements if isinstance(weights, cst.List) else None
        if weights is not None and wl is None:
            self.plan.manual.append((self.line(rubric_call), "weights are not a literal list: every reward gets "
                                     "weight 1.0; set the real weights in @vf.reward(weight=...)"))
        return [(el.value, _code(wl[i].value) if wl is not None and i < len(wl) else "1.0", False)
                for i, el in enumerate(funcs.elements)]

    def _added_funcs(self, rubric_var: str) -> list[tuple[cst.BaseExpression, str, bool]]:
        """`rubric.add_reward_func(f, w)` / `rubric.add_metric(f)` statements in load_environment."""
        items = []
        for s in self.body:
            if not (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr)):
                continue
            call = s.body[0].value
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
                    _code(call.func.value) == rubric_var and call.func.attr.value in ("add_reward_func", "add_metric"):
                metric = call.func.attr.value == "add_metric"
                w = next((_code(a.value) for a in call.args[1:] if a.keyword is None or a.keyword.value == "weight"),
                         "0.0" if metric else "1.0")
                items.append((call.args[0].value, w, metric))
        return items

    def _plan_func(self, i: int, fn, w: str, metric: bool, used: set[str]) -> None:
        group = False
        if isinstance(fn, cst.Name):
            name = fn.value
            if name in self.functions:
                group = bool({p.name.value for p in self.functions[name].params.params} & PLURAL)
        elif isinstance(fn, cst.Call) and isinstance(fn.func, cst.Attribute) and fn.func.attr.value == "get_format_reward_func":
            name = "format_reward_func"
        else:
            name = self._factory_name(fn) or f"reward_{i}"
        name = re.sub(r"\W", "_", name)
        while name in used:
            name += "_2"
        used.add(name)
        try:
            is_zero = float(w) == 0.0
        except ValueError:
            is_zero = False
            if not re.fullmatch(r"-?[\d.eE+-]+", w):
                self.plan.manual.append((self.line(fn), f"weight of {name} is not a literal ({w}); set it by hand"))
                w = "1.0"
        self.plan.funcs.append(_Func(i, name, w, metric or is_zero, self.line(fn), group))
        if group:
            self.add(fn, "ENV012", MANUAL, f"group reward {name} → Env.finalize over the episode's traces; v0 scored "
                     "the rollouts of one prompt together: check the grouping (e.g. --env.id best-of-n)")
        else:
            self.add(fn, "ENV003", MIGRATED,
                     f"reward function {name} (weight {w}) → @vf.{'metric' if metric or is_zero else 'reward'}")

    def _factory_name(self, fn) -> str | None:
        """`create_weighted_rewards()`: a call to a function of load_environment (or the module) that
        defines one function and returns it: v0 named the reward after that inner function."""
        if not (isinstance(fn, cst.Call) and isinstance(fn.func, cst.Name)):
            return None
        defs = [s for s in self.body if isinstance(s, cst.FunctionDef) and s.name.value == fn.func.value]
        factory = defs[-1] if defs else self.functions.get(fn.func.value)
        if factory is None:
            return None
        body = list(factory.body.body)
        inner = [s for s in body if isinstance(s, cst.FunctionDef)]
        last = body[-1] if body else None
        if len(inner) == 1 and isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return) \
                and isinstance(last.body[0].value, cst.Name) and last.body[0].value.value == inner[0].name.value:
            return inner[0].name.value
        return None

    def slice_env_parts(self, env_call: cst.Call) -> None:
        """The env constructor without its data arguments, and the backward slice of load_environment's
        statements it needs (for `_v0_env()`), with the parameters that slice reads."""
        env_expr = env_call.with_changes(args=[a for a in env_call.args if a.star != "**" and
                                               not (a.keyword is not None and a.keyword.value in DATA_ARGS)])
        if env_expr.args:
            last = env_expr.args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            env_expr = env_expr.with_changes(args=[*env_expr.args[:-1], last])
        self.env_expr = env_expr
        self.params = [*self.load_env.params.params, *self.load_env.params.kwonly_params]
        names = [p.name.value for p in self.params]
        needed = used_names(env_expr) | {n for p in self.post_env for n in used_names(p)}
        self.slice_stmts = []
        for s in reversed(self.body):
            if defined_names(s) & needed:
                self.slice_stmts.insert(0, s)
                needed |= used_names(s)
        self.bound = sorted(needed & set(names), key=names.index)

    def plan_tools(self, tools_arg) -> None:
        if tools_arg is None:
            return
        value = tools_arg.value
        if isinstance(value, cst.Name) and value.value in self.module_lists:  # tools=tool_list, a module-level list
            value = self.module_lists[value.value]
        for e in value.elements if isinstance(value, cst.List) else []:
            # a v0 library tool (`from verifiers.utils.tools import python`): its compat twin, wrapped the same way
            if isinstance(e.value, cst.Name) and e.value.value not in self.functions and e.value.value in self.v0_imported:
                self.functions[e.value.value] = _library_tool(e.value.value)
        if isinstance(value, cst.List) and all(isinstance(e.value, cst.Name) and e.value.value in self.functions
                                               for e in value.elements):
            self.tool_names += [e.value.value for e in value.elements if e.value.value not in self.tool_names]
            self.add(tools_arg, "ENV007", MIGRATED, f"tools {', '.join(self.tool_names)} → @vf.tool methods of {self.base}Tools")
        else:
            self.plan.manual.append((self.line(tools_arg), "tools are not a list of module-level functions: write a "
                                     "vf.Toolset with @vf.tool methods by hand"))

    # ---- output --------------------------------------------------------------------------------

    def fill(self, stmts: list) -> list:
        """The generated statements with their __VF_*__() markers replaced by (renamed) original code."""
        out = []
        for s in stmts:
            marker = (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr)
                      and isinstance(s.body[0].value, cst.Call) and isinstance(s.body[0].value.func, cst.Name)
                      and s.body[0].value.func.value)
            if marker in ("__VF_LOAD_BODY__", "__VF_PARTS_BODY__"):
                load = marker == "__VF_LOAD_BODY__"
                out += [self.renamed(x, report=load) for x in (self.body if load else self.slice_stmts)]
            elif marker == "__VF_ENV_EXPR__" and self.post_env:
                out.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(self.env_var))],
                                                               self.ren(self.env_expr))]))
                out += [self.renamed(x, report=False) for x in self.post_env]
                out.append(cst.SimpleStatementLine([cst.Return(cst.Name(self.env_var))]))
            elif marker == "__VF_ENV_EXPR__":
                out.append(cst.SimpleStatementLine([cst.Return(self.ren(self.env_expr))]))
            elif marker and marker.startswith("__VF_TOOL_"):
                name = marker[len("__VF_TOOL_"):-2]
                out.append(_tool_method(self.functions[name], self.plan.skip.get(name, ()), self.plan.stateful))
            elif isinstance(s, (cst.FunctionDef, cst.ClassDef)):
                out.append(s.with_changes(body=s.body.with_changes(body=self.fill(list(s.body.body)))))
            else:
                out.append(s)
        return out

    def renamed(self, stmt, report: bool = True):
        """`stmt` with `verifiers.X` → `compat.X`; names compat lacks are flagged (and reported)."""
        self.renamer.unknown, self.renamer.inert = set(), set()
        new = self.ren(stmt)
        if self.renamer.inert and report:
            self.add(stmt, "ENV014", INFO, INERT_NOTE.format(names=", ".join(f"@{n}" for n in sorted(self.renamer.inert))))
        if self.renamer.unknown:
            names = ", ".join(sorted(self.renamer.unknown))
            new = _flag(new, _port(sorted(self.renamer.unknown)))
            if report:
                self.add(stmt, "ENV900", MANUAL, f"uses verifiers {names}")
        return new

    def assemble(self, gen_stmts: list) -> str:
        """The new module: imports rewritten, load_environment replaced by the generated block."""
        new_body, imported_vf = [], [False, False]
        for stmt in self.mod.body:
            if stmt is self.load_env:
                new_body.extend(gen_stmts)
            elif isinstance(stmt, cst.SimpleStatementLine) and any(
                    isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                new_body.extend(_rewrite_imports(stmt, self.add, self.line, imported_vf))
            else:
                new_body.append(self.renamed(stmt))
                if isinstance(stmt, cst.ClassDef) and stmt.name.value == self.v0_class and self.kind == "multi":
                    self.add(stmt, "ENV006", MIGRATED, f"{self.v0_class}.env_response runs through "
                             f"{self.N['Task'][:-4]}Env (compat.MultiTurnAdapter)")
        if not any(isinstance(s, cst.SimpleStatementLine) and "__all__" in _code(s) for s in new_body):
            new_body.append(cst.parse_statement(f'__all__ = ["{self.N["Taskset"]}"]\n').with_changes(
                leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
        for ln, msg in self.plan.manual:
            self.report.add(self.path, ln, "ENV900", MANUAL, msg)
        module = self.mod.with_changes(body=new_body)
        if self.plan.judge is not None:  # the env's own judge clients reach the task's judge
            routed = _JudgeClients(self.openai_names)
            module = module.visit(routed)
            if routed.found:
                self.add(self.load_env, "ENV010", MIGRATED, f"judge client {', '.join(sorted(routed.found))}(...) → "
                         f"compat.OpenAI: code that calls it directly (client.chat.completions.create) reaches "
                         f"{self.judge_cls} while a reward runs, with the run's judge settings; elsewhere it is the "
                         "real client")
        return module.code

    # ---- the generated block (text with __VF_*__() markers that `fill` replaces by original code) ----

    def generate(self) -> str:
        L: list[str] = ["# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----", ""]
        if any(_field_type(p) == "typing.Any" for p in self.params):
            L += ["import typing", ""]
        L += [f"class {self.N['Data']}(vf.TaskData):", '    """One row of the v0 dataset."""', "",
              '    answer: str = ""', "    info: dict = {}", "", ""]
        L += self.gen_judge() + self.gen_config() + self.gen_v0_env() + self.gen_state_and_tools()
        L += self.gen_env() + self.gen_task() + self.gen_taskset()
        todos = [f"# {TODO}: {msg}" + (f" (line {ln} of the v0 module)" if ln else "") for ln, msg in self.plan.manual]
        return "\n".join(L[:2] + todos + ([""] if todos else []) + L[2:]) + "\n"

    def gen_judge(self) -> list[str]:
        self.task_config = "vf.TaskConfig"
        if self.plan.judge is None:
            return []
        self.judge_cls, self.task_config = self.fresh(self.base + "Judge"), self.fresh(self.base + "TaskConfig")
        judge_config = self.fresh(self.base + "JudgeConfig")
        fields = [f"    model: str = {self.plan.judge['model']}"]
        if "base_url" in self.plan.judge:
            fields.append(f"    base_url: str | None = {self.plan.judge['base_url']}")
        if "api_key_var" in self.plan.judge:
            fields.append(f"    api_key_var: str = {self.plan.judge['api_key_var']}")
        return [f"class {self.judge_cls}(vf.Judge):",
                '    """The v0 JudgeRubric\'s judge: its reply text is what v0\'s `judge(...)` returned."""', "",
                f"    prompt = {self.plan.judge['prompt']}", "", "",
                f"class {judge_config}(vf.JudgeConfig):",
                '    """The v0 judge client\'s settings (`--taskset.task.judge.*` sets one, keeping the others)."""', "",
                *fields, "", "",
                f"class {self.task_config}(vf.TaskConfig):",
                f"    judge: {judge_config} = {judge_config}()", "", ""]

    def gen_config(self) -> list[str]:
        """The TasksetConfig: load_environment's keyword parameters as typed fields."""
        params, kwargs, load_env = self.params, self.kwargs, self.load_env
        L = [f"class {self.N['Config']}(vf.TasksetConfig):", '    """The keyword arguments of the v0 load_environment()."""', ""]
        fields = []
        self.object_params = {p.name.value for p in params if _object_param(p)}
        for p in params:
            if p.name.value in self.object_params:
                self.add(load_env, "ENV001", INFO, f"parameter {p.name.value} ({_code(p.annotation.annotation) if p.annotation else 'an object'}) "
                         f"is no config field (a config is set from the command line; an object cannot be): it keeps "
                         f"its default {_inline(p.default)}")
                continue
            default = f" = {_inline(self.ren(p.default))}" if p.default is not None else ""
            fields.append(f"    {_field(p.name.value)}: {_field_type(p)}{default}")
            if _field(p.name.value) != p.name.value:
                self.add(load_env, "ENV001", INFO, f"parameter {p.name.value} is config field {_field(p.name.value)} "
                         f"(vf.TasksetConfig.{p.name.value} means something else): --taskset.{_field(p.name.value)}")
        self.split_field = None
        if "eval_dataset" in kwargs and "dataset" in kwargs:
            self.split_field = "split" if "split" not in {p.name.value for p in params} else "dataset_split"
            fields.append(f'    {self.split_field}: str = "eval"')
            fields.append('    """Which v0 dataset load() yields: "eval" (eval_dataset) or "train" (dataset)."""')
        if self.plan.judge is not None:
            fields.append(f"    task: {self.task_config} = {self.task_config}()")
            bound = {k: a for k, a in self.plan.judge["args"].items() if a not in self.object_params}
            if bound:
                fields += ["", "    # load_environment's judge arguments given for a run reach the judge (task.judge.* wins)",
                           f"    _v0_judge_arguments = compat.judge_arguments("
                           f"{', '.join(f'{k}={a!r}' for k, a in bound.items())})"]
        L += (fields or ["    pass"]) + ["", ""]
        self.add(load_env, "ENV001", MIGRATED, f"load_environment() → {self.N['Taskset']} (config {self.N['Config']}: "
                 f"{', '.join(p.name.value for p in params) or 'no fields'})")
        if load_env.params.star_kwarg is not None:
            self.add(load_env, "ENV001", INFO, f"**{load_env.params.star_kwarg.name.value} of load_environment is dropped "
                     "(v1 config fields are typed); env options it carried are run flags now (--max-turns, --sampling.*)")
        return L

    def gen_v0_env(self) -> list[str]:
        L = ["@compat.cache", "def _v0_env():",
             '    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards',
             '    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""']
        for name in self.bound:
            p = next(p for p in self.params if p.name.value == name)
            default = _inline(self.ren(p.default)) if p.default is not None else "None"
            L.append(f"    {name} = {default}  # default of load_environment({name}=...)")
            if name in self.object_params:
                continue
            self.add(self.load_env, "ENV001", INFO, f"the parser/rubric are rebuilt with load_environment's default "
                     f"{name}={default}; a different --taskset.{name} does not reach them")
        return L + ["    __VF_PARTS_BODY__()", "    __VF_ENV_EXPR__()", "", ""]

    def gen_state_and_tools(self) -> list[str]:
        plan, L = self.plan, []
        self.state_cls = "vf.State"
        if plan.stateful or plan.setup_state:
            self.state_cls = self.fresh(self.base + "State")
            L += [f"class {self.state_cls}(vf.State):", '    """Per-rollout state: the v0 state dict, kept whole."""', "",
                  "    v0_state: dict = {}", "", ""]
        self.tools_cls = self.sandbox_cls = None
        if self.sandbox:
            compat_cls, tool_name = SANDBOX_TOOLS[self.sandbox]
            self.sandbox_cls = self.fresh(self.base + compat_cls)
            L += [f"class {self.sandbox_cls}(compat.{compat_cls}):",
                  f'    """v0 {self.sandbox}\'s `{tool_name}` tool, run in the rollout\'s runtime with the env\'s options."""', "",
                  "    v0_env = staticmethod(_v0_env)", "", ""]
            self.add(self.load_env, "ENV015", MIGRATED, f"{self.sandbox} → {self.sandbox_cls}: its {tool_name} tool runs in "
                     "the rollout's vf runtime (a bubblewrap sandbox unless --env.agent.runtime.type says otherwise)")
        if self.tool_names:
            self.tools_cls = self.fresh(self.base + "Tools")
            generic = f"[vf.ToolsetConfig, {self.state_cls}]" if plan.stateful else ""
            L += [f"class {self.tools_cls}(vf.Toolset{generic}):", '    """The v0 ToolEnv tools, called unchanged."""', "",
                  "    TOOL_PREFIX = None  # v0 tool names, unprefixed", ""]
            for t in self.tool_names:
                L += [f"    __VF_TOOL_{t}__()", ""]
            L += [""]
            if plan.stateful:
                hidden = ", ".join(sorted({a for v in plan.skip.values() for a in v})) or "its"
                self.add(self.load_env, "ENV011", MIGRATED, f"StatefulToolEnv → {self.tools_cls} (a Toolset with typed "
                         f"state {self.state_cls}); update_tool_args fills {hidden} hidden arguments")
        return L

    def gen_env(self) -> list[str]:
        """A MultiTurnAdapter for a multi-turn env, a program seat for a CliAgentEnv; an Env.finalize
        for group rewards."""
        group = [f for f in self.plan.funcs if f.group]
        self.env_cls = None
        if self.kind == "agent":
            return self.gen_agent_env(group)
        if self.kind != "multi" and not group:
            return []
        self.env_cls = self.fresh(self.base + "Env")
        if self.kind == "multi":
            L = [f"class {self.env_cls}(compat.MultiTurnAdapter):",
                 f'    """Runs the v0 {self.v0_class or "environment"}\'s is_completed/env_response after each model reply."""',
                 "", "    v0_env = staticmethod(_v0_env)", ""]
            if self.v0_class is None:
                self.plan.manual.append((0, "a multi-turn env without a subclass: it has no env_response; check the Env"))
        else:
            L = [f"class {self.env_cls}(vf.Env):", '    """Scores the v0 group rewards over the episode\'s traces."""', ""]
        if group:
            L += ["    async def finalize(self, task, episode):",
                  f"        # {TODO}: v0 scored these over the rollouts of one prompt; here they score the traces",
                  "        # of one episode (one trace unless the env runs several, e.g. --env.id best-of-n)"]
            L += [f"        await compat.group_score(_v0_env(), {f.index}, {f.name!r}, {f.weight}, task, episode)"
                  for f in group]
            L += [""]
        return L + [""]

    def gen_agent_env(self, group: list) -> list[str]:
        """v0 CliAgentEnv: its run_command as the seat's default program harness (ENV017)."""
        harness, config = self.fresh(self.base + "Agent"), self.fresh(self.base + "EnvConfig")
        self.env_cls = self.fresh(self.base + "Env")
        self.add(self.load_env, "ENV017", MIGRATED, f"CliAgentEnv → {harness}, the seat's default program harness: "
                 "run_command runs in the rollout's runtime, its model calls intercepted (--env.agent.harness.id "
                 "picks another)")
        if group:
            self.plan.manual.append((0, "group reward functions of a CliAgentEnv: score them in Env.finalize by hand"))
        return [f"class {harness}(compat.CliAgentHarness):",
                '    """The v0 CliAgentEnv\'s run_command, as a program harness."""', "",
                "    v0_env = staticmethod(_v0_env)", "", "",
                f"class {config}(vf.SingleAgentEnvConfig):",
                f'    agent: vf.AgentConfig = vf.AgentConfig(harness=vf.HarnessConfig(id=f"{{__file__}}:{harness}"))', "", "",
                f"class {self.env_cls}(vf.Env[{config}]):",
                f'    """One seat, which runs {harness} unless --env.agent.harness.id says otherwise."""', "", ""]

    def gen_task(self) -> list[str]:
        """The Task: toolsets, setup, the stop condition and one reward/metric method per v0 function."""
        plan = self.plan
        L = [f"class {self.N['Task']}(vf.Task[{self.N['Data']}, {self.state_cls}, {self.task_config}]):", ""]
        toolsets = [c for c in (self.tools_cls, self.sandbox_cls) if c]
        if toolsets:
            L += [f"    toolsets = [{', '.join(toolsets)}]", ""]
        if plan.setup_state or self.sandbox_hooks:
            with_runtime = self.sandbox_hooks or self.sandbox is not None  # self.sandbox_client needs its runtime
            L += ["    async def setup(self, trace, state, runtime):" if with_runtime else
                  "    async def setup(self, trace, state):",
                  f'        """The v0 {self.v0_class}.setup_state."""' if not self.sandbox_hooks else
                  f'        """The v0 {self.v0_class}\'s {"setup_state and " if plan.setup_state else ""}sandbox hooks '
                  '(build_env_vars, post_sandbox_setup), on the rollout\'s runtime."""']
            if plan.setup_state:
                L += ["        await compat.setup_state(_v0_env(), self.data, trace, state"
                      f"{', runtime' if self.sandbox is not None else ''})"]
            if self.sandbox_hooks:
                L += ["        await compat.sandbox_setup(_v0_env(), compat.v0_state(self.data, trace, state), runtime)"]
            L += [""]
        L += ["    def validate(self):",
              '        """v0 had no gold reply: vf-validate scores a probe reply (the row\'s answer in the parser\'s',
              '        format, a judge answering itself) and fails when a reward function raises."""',
              "        return compat.probe(_v0_env(), self.data)", ""]
        if self.kind == "single":
            L += ["    @vf.stop", "    def single_turn(self, trace) -> bool:", "        return trace.num_turns >= 1", ""]
            self.add(self.load_env, "ENV005", MIGRATED, "SingleTurnEnv → @vf.stop single_turn")
        else:
            L += ["    @vf.stop", "    def max_turns(self, trace) -> bool:",
                  "        limit = _v0_env().max_turns", "        return limit > 0 and trace.num_turns >= limit", ""]
        judge_arg = ""
        if plan.judge is not None:
            judge_arg = ", judge=compat.JudgeCall(" + self.judge_cls + "(self.config.judge), trace, _v0_env().rubric.parser)"
        # vf runs a task's rewards (and its metrics) by priority, then by name; v0 ran them in the
        # rubric's order, and a function may read what an earlier one left in the state (a judge reply)
        order: dict[str, list[str]] = {}
        for f in plan.funcs:
            if not f.group:
                order.setdefault("metric" if f.metric and float(f.weight or 0) == 0 else "reward", []).append(f.name)
        priority = {n: len(names) - i for names in order.values() if names != sorted(names)
                    for i, n in enumerate(names)}
        for f in plan.funcs:
            if f.group:
                continue
            prio = f"priority={priority[f.name]}" if f.name in priority else ""
            deco = (f"@vf.metric({prio})" if prio else "@vf.metric") if f.metric and float(f.weight or 0) == 0 \
                else f"@vf.reward(weight={f.weight}{', ' + prio if prio else ''})"
            L += [f"    {deco}", f"    def {f.name}(self, task, trace, state):",
                  f"        return _v0_env().score({f.index}, task, trace, state{judge_arg})", ""]
        return L

    def gen_taskset(self) -> list[str]:
        """The Taskset: load() runs load_environment's body and yields the v0 dataset's rows."""
        kwargs = self.kwargs
        L = ["", f"class {self.N['Taskset']}(vf.Taskset[{self.N['Task']}, {self.N['Config']}]):"]
        if self.docstring is not None:
            L += ["    " + _code(self.docstring.body[0].value), ""]
        if self.env_cls:
            L += [f"    ENV = {self.env_cls}", ""]
        if self.mcp:
            L += ["    @classmethod", "    def toolsets(cls, config):",
                  '        """v0 MCPEnv\'s servers: started once per run, their tools shared by every rollout."""',
                  "        return _v0_env().toolsets()", ""]
            self.add(self.load_env, "ENV016", MIGRATED, "MCPEnv → its servers as shared stdio toolsets "
                     f"({self.N['Taskset']}.toolsets): started once per run on the host, as v0 did")
        L += ["    def load(self):"]
        L += [f"        {p.name.value} = {_inline(self.ren(p.default))}" if p.name.value in self.object_params else
              f"        {p.name.value} = self.config.{_field(p.name.value)}" for p in self.params]
        L.append("        __VF_LOAD_BODY__()")
        ds = self.code(kwargs["dataset"].value) if "dataset" in kwargs else None
        eds = self.code(kwargs["eval_dataset"].value) if "eval_dataset" in kwargs else None
        src = f'({eds} if self.config.{self.split_field} == "eval" else {ds})' if ds and eds else ds or eds or "None"
        extra = "".join(f", {k}={self.code(kwargs[k].value)}" for k in ("system_prompt", "few_shot") if k in kwargs)
        L.append(f"        yield from compat.rows({src}, {self.N['Data']}{extra})")
        if "dataset" in kwargs or "eval_dataset" in kwargs:
            self.add(kwargs.get("dataset") or kwargs["eval_dataset"], "ENV002", MIGRATED,
                     f"dataset rows → {self.N['Data']} (prompt/question, answer, info)")
        else:
            self.plan.manual.append((0, "no dataset= in the environment constructor: load() yields nothing"))
        return L


class _JudgeClients(cst.CSTTransformer):
    """`OpenAI(...)` / `AsyncOpenAI(...)` (imported from openai, or `openai.X(...)`) → `compat.X(...)`."""

    def __init__(self, names: dict[str, str]):
        self.names = dict(names)
        self.found: set[str] = set()

    def leave_Call(self, original, updated):
        func = updated.func
        kind = None
        if isinstance(func, cst.Name) and func.value in self.names:
            kind = self.names[func.value]
        elif isinstance(func, cst.Attribute) and func.attr.value in ("OpenAI", "AsyncOpenAI") and \
                _code(func.value) == "openai":
            kind = func.attr.value
        if kind is None:
            return updated
        self.found.add(kind)
        return updated.with_changes(func=cst.Attribute(cst.Name("compat"), cst.Name(kind)))


class MigrationError(ValueError):
    """A file that looks like a v0 environment but has no shape the codemod knows."""


def _is_verifiers_from(node) -> bool:
    return isinstance(node, cst.ImportFrom) and node.module is not None and \
        (_code(node.module) == "verifiers" or _code(node.module).startswith("verifiers."))


def _port(names: list[str]) -> str:
    """The TODO for v0 names compat has no twin for."""
    if set(names) <= TRAINING:
        return (f"verifiers {', '.join(names)}: v0's Python training API; vf trains from the command line: "
                "vf-train --taskset <a migrated load_environment() module> (flags: docs/cli.md)")
    return f"verifiers {', '.join(names)} has no vf equivalent; port it"


def _missing_names(node: cst.ImportFrom) -> list[str]:
    names = [] if isinstance(node.names, cst.ImportStar) else [a.name.value for a in node.names]
    return [n for n in names if n not in SUPPORTED]


def _to_compat(node: cst.ImportFrom) -> cst.ImportFrom:
    return node.with_changes(module=cst.parse_expression("vf.migrate.compat"), relative=[])


def _rewrite_imports(stmt, add, line, imported_vf):
    out = []
    for small in stmt.body:
        if isinstance(small, cst.Import) and any(_code(a.name) in V0_PACKAGES for a in small.names):
            rest = [a for a in small.names if _code(a.name) not in V0_PACKAGES]
            if rest:
                out.append(cst.SimpleStatementLine([small.with_changes(names=[*rest[:-1], rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])]))
            if not imported_vf[0]:
                out.append(cst.parse_statement("import vf\n"))
                imported_vf[0] = True
            if not imported_vf[1]:
                out.append(cst.parse_statement("from vf.migrate import compat\n"))
                imported_vf[1] = True
            add(stmt, "ENV008", MIGRATED, "import verifiers → import vf + vf.migrate.compat")
        elif isinstance(small, cst.ImportFrom) and small.module is not None and _code(small.module) == "datasets" \
                and not isinstance(small.names, cst.ImportStar) and any(a.name.value == "load_dataset" for a in small.names):
            # load_dataset goes through compat, which reads $VF_DATA_DIR's local files when set
            rest = [a for a in small.names if a.name.value != "load_dataset"]
            if rest:
                out.append(cst.SimpleStatementLine([small.with_changes(
                    names=[*rest[:-1], rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)],
                    lpar=None, rpar=None, semicolon=cst.MaybeSentinel.DEFAULT)]))
            alias = next(a for a in small.names if a.name.value == "load_dataset")
            out.append(cst.SimpleStatementLine([cst.ImportFrom(
                module=cst.parse_expression("vf.migrate.compat"),
                names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)])]))
            add(stmt, "ENV008", MIGRATED, "datasets.load_dataset → compat.load_dataset (the hub as before; local "
                "JSON-lines files under $VF_DATA_DIR when set)")
        elif _is_verifiers_from(small):
            new = cst.SimpleStatementLine([_to_compat(small).with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
            missing = _missing_names(small)
            if missing:
                new = _flag(new, _port(missing))
                add(stmt, "ENV900", MANUAL, f"imports verifiers {', '.join(missing)}")
            if not imported_vf[0]:
                out.append(cst.parse_statement("import vf\n"))
                imported_vf[0] = True
            if not imported_vf[1]:
                out.append(cst.parse_statement("from vf.migrate import compat\n"))
                imported_vf[1] = True
            out.append(new)
            add(stmt, "ENV008", MIGRATED, f"from {_code(small.module)} import ... → from vf.migrate.compat import ...")
        else:
            out.append(cst.SimpleStatementLine([small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]))
    if out:
        out[0] = out[0].with_changes(leading_lines=[*stmt.leading_lines, *out[0].leading_lines])
    return out


def _library_tool(name: str) -> cst.FunctionDef:
    """A stand-in definition of compat's `name` tool (signature and docstring), for `_tool_method`."""
    import inspect

    from vf.migrate import compat

    fn = getattr(compat, name)
    return cst.parse_statement(f"def {name}{inspect.signature(fn)}:\n    {inspect.getdoc(fn)!r}\n")


def _tool_method(fn: cst.FunctionDef, skip=(), stateful: bool = False) -> cst.FunctionDef:
    """`def add(a: int, b: int) -> int` → `@vf.tool def add(self, a: int, b: int) -> int: return add(a=a, b=b)`.

    For a StatefulToolEnv, the `args_to_skip` parameters leave the signature (the model never
    sees them) and the call's arguments go through the v0 env's `update_tool_args`."""
    ps = fn.params
    name = fn.name.value
    visible = [p for p in [*ps.posonly_params, *ps.params] if p.name.value not in skip]
    kwonly = [p for p in ps.kwonly_params if p.name.value not in skip]
    stmts = []
    if fn.body.body and _is_docstring(fn.body.body[0]):
        stmts.append(fn.body.body[0])
    aw = "await " if fn.asynchronous else ""
    if stateful:
        given = ", ".join(f"{p.name.value!r}: {p.name.value}" for p in [*visible, *kwonly])
        stmts.append(cst.parse_statement(f"args = compat.tool_args(_v0_env(), {name!r}, {{{given}}}, self.state)\n"))
        stmts.append(cst.parse_statement(f"return {aw}{name}(**args)\n"))
    else:
        call_args = [f"{p.name.value}" for p in ps.posonly_params] + \
            [f"{p.name.value}={p.name.value}" for p in [*ps.params, *ps.kwonly_params]]
        stmts.append(cst.parse_statement(f"return {aw}{name}({', '.join(call_args)})\n"))
    self_param = cst.Param(cst.Name("self"))
    params = [p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in visible]
    kw = [p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in kwonly]
    star = ps.star_arg if kw or not isinstance(ps.star_arg, cst.ParamStar) else cst.MaybeSentinel.DEFAULT
    return fn.with_changes(
        decorators=[cst.Decorator(cst.parse_expression("vf.tool"))],
        params=ps.with_changes(params=[self_param, *params], posonly_params=[], kwonly_params=kw,
                               posonly_ind=cst.MaybeSentinel.DEFAULT, star_arg=star),
        body=cst.IndentedBlock(body=stmts), leading_lines=[cst.EmptyLine()])


def _calls(node: cst.CSTNode, method: str) -> list[cst.Call]:
    """Calls `self.<method>(...)` anywhere under `node`."""
    found: list[cst.Call] = []

    class V(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            f = call.func
            if isinstance(f, cst.Attribute) and f.attr.value == method and _code(f.value) == "self":
                found.append(call)

    node.visit(V())
    return found


RESERVED_FIELDS = {"id", "system_prompt", "task"}
"""vf.TasksetConfig's own fields (system_prompt there is a file that overrides the prompt)."""


def _field(param: str) -> str:
    """The config field for a load_environment parameter: its name, unless vf.TasksetConfig has it."""
    return f"v0_{param}" if param in RESERVED_FIELDS else param


def _judge_settings(call: cst.Call, load_env: cst.FunctionDef) -> dict[str, str]:
    """The judge model and prompt as class-level expressions: literals and module names stay,
    a load_environment parameter becomes its default."""
    defaults = {p.name.value: p.default for p in [*load_env.params.params, *load_env.params.kwonly_params]}
    out: dict = {"model": '"gpt-4.1-nano"', "prompt": "compat.JUDGE_PROMPT", "args": {}}
    client = next((a.value for a in call.args if a.keyword is not None and a.keyword.value in ("judge_client", "client")
                   and isinstance(a.value, cst.Call)), None)
    if client is None:  # judge_client=NAME: NAME = OpenAI(...) in load_environment
        name = next((_code(a.value) for a in call.args if a.keyword is not None
                     and a.keyword.value in ("judge_client", "client") and isinstance(a.value, cst.Name)), None)
        client = next((s.body[0].value for s in load_env.body.body if name and isinstance(s, cst.SimpleStatementLine)
                       and isinstance(s.body[0], cst.Assign) and _code(s.body[0].targets[0].target) == name
                       and isinstance(s.body[0].value, cst.Call)), None)
    for a in client.args if client is not None else []:  # OpenAI(base_url=..., api_key=os.getenv(VAR, ...))
        value, arg = a.value, None
        if isinstance(value, cst.Name) and value.value in defaults:
            value, arg = defaults[value.value], value.value
        if a.keyword is None or value is None:
            continue
        if a.keyword.value == "base_url" and isinstance(value, cst.SimpleString):
            out["base_url"] = _code(value)
            if arg:
                out["args"]["base_url"] = arg
        elif a.keyword.value == "api_key" and isinstance(value, cst.Call) and _code(value.func) in ("os.getenv",
                                                                                                 "os.environ.get"):
            var = value.args[0].value if value.args else None
            if isinstance(var, cst.Name) and var.value in defaults:
                out["args"]["api_key_var"] = var.value
                var = defaults[var.value]
            if isinstance(var, cst.SimpleString):
                out["api_key_var"] = _code(var)
            else:
                out["args"].pop("api_key_var", None)
    for a in call.args:
        if a.keyword is None or a.keyword.value not in ("judge_model", "model", "judge_prompt"):
            continue
        value = a.value
        if isinstance(value, cst.Name) and value.value in defaults:
            if a.keyword.value != "judge_prompt":
                out["args"]["model"] = value.value
            value = defaults[value.value]
            if value is None and a.keyword.value != "judge_prompt":
                continue  # a required argument: the run gives it, and it reaches the judge (args)
        elif isinstance(value, cst.Name):  # a local of load_environment: its literal value, if it has one
            local = [s.body[0].value for s in load_env.body.body if isinstance(s, cst.SimpleStatementLine)
                     and isinstance(s.body[0], cst.Assign) and _code(s.body[0].targets[0].target) == value.value]
            if local:  # else a module-level name, kept as it is
                value = local[-1] if _static_string(local[-1]) else None
        if value is None or not (_static_string(value) or isinstance(value, (cst.Name, cst.Attribute))):
            # never the default prompt in silence: the rewards would be judged against another question
            out.setdefault("unresolved", []).append(a.keyword.value)
            continue
        out["prompt" if a.keyword.value == "judge_prompt" else "model"] = _code(value)
    return out


def _static_string(node) -> bool:
    """A string known without running load_environment: a literal, or a literal's `.strip()` (simpleqa's
    `JUDGE_TEMPLATE = \"\"\"...\"\"\".strip()`), `.lstrip()`, `.rstrip()`."""
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        return True
    return isinstance(node, cst.Call) and not node.args and isinstance(node.func, cst.Attribute) and \
        node.func.attr.value in ("strip", "lstrip", "rstrip") and _static_string(node.func.value)


SAFE_TYPES = {"int", "float", "str", "bool", "bytes", "list", "dict", "tuple", "set", "frozenset", "None", "Any",
              "Optional", "Union", "Literal", "List", "Dict", "Tuple", "Set", "FrozenSet", "Sequence", "Mapping",
              "Iterable", "typing", "Callable"}
"""Names an annotation may use and still be a config field pydantic can build from the command line."""


def _object_param(p: cst.Param) -> bool:
    """A load_environment parameter that holds an object (`parser: XMLParser = XMLParser(...)`,
    `client: AsyncOpenAI | None = None`): no config field can carry it (pydantic has no schema
    for the type, and no command line could set it), so it keeps its default."""
    if p.default is None:
        return False  # required: stays a field (typed as written), the caller must pass it
    if p.annotation is not None:
        ann = p.annotation.annotation
        if isinstance(ann, (cst.SimpleString, cst.ConcatenatedString)):  # "XMLParser": a forward reference
            return not set(re.findall(r"[A-Za-z_]\w*", _code(ann))) <= SAFE_TYPES
        return not used_names(ann) <= SAFE_TYPES
    d = p.default
    return isinstance(d, cst.Call) and not (isinstance(d.func, cst.Name) and d.func.value in SAFE_TYPES)


def _field_type(p: cst.Param) -> str:
    if p.annotation is not None:
        return _inline(p.annotation.annotation)
    d = p.default
    if isinstance(d, cst.Integer):
        return "int"
    if isinstance(d, cst.Float):
        return "float"
    if isinstance(d, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return "str"
    if isinstance(d, cst.Name) and d.value in ("True", "False"):
        return "bool"
    if isinstance(d, cst.List):
        return "list"
    if isinstance(d, cst.Dict):
        return "dict"
    return "typing.Any"
