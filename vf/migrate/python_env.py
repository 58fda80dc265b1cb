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
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from vf.migrate.compat import SUPPORTED
from vf.migrate.report import INFO, MANUAL, MIGRATED, Report

ENV_KINDS = {"SingleTurnEnv": "single", "MultiTurnEnv": "multi", "ToolEnv": "tool", "Environment": "multi",
             "StatefulToolEnv": "tool"}
DATA_ARGS = ("dataset", "eval_dataset", "system_prompt", "few_shot")
TASK_ATTRS = {"setup", "finalize", "validate", "messages", "hooks", "data", "config", "toolsets"}
PLURAL = {"completions", "prompts", "answers", "infos", "states", "tasks"}
TODO = "TODO(vf-migrate)"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


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

    def leave_Attribute(self, original, updated):
        if isinstance(updated.value, cst.Name) and updated.value.value in self.aliases:
            if updated.attr.value not in SUPPORTED:
                self.unknown.add(updated.attr.value)
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
        report = _migrate_environment(path, source)
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
    return _unmigrated(path, source, reason)


def _unmigrated(path: Path, source: str, reason: str) -> Report:
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
    report = Report()
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    pos = wrapper.resolve(PositionProvider)
    mod = wrapper.module
    line = lambda n: pos[n].start.line if n in pos else 0
    add = lambda n, rule, status, msg: report.add(path, n if isinstance(n, int) else line(n), rule, status, msg)

    # ---- imports and aliases -----------------------------------------------------------------
    aliases: set[str] = set()
    from_names: set[str] = set()
    module_names: set[str] = set()
    functions: dict[str, cst.FunctionDef] = {}
    classes: dict[str, cst.ClassDef] = {}
    load_env: cst.FunctionDef | None = None
    for stmt in mod.body:
        module_names |= defined_names(stmt)
        if isinstance(stmt, cst.FunctionDef):
            if stmt.name.value == "load_environment":
                load_env = stmt
            else:
                functions[stmt.name.value] = stmt
        elif isinstance(stmt, cst.ClassDef):
            classes[stmt.name.value] = stmt
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for a in small.names:
                        if _code(a.name) == "verifiers":
                            aliases.add(a.asname.name.value if a.asname else "verifiers")
                elif isinstance(small, cst.ImportFrom) and small.module is not None and _code(small.module) == "verifiers":
                    if not isinstance(small.names, cst.ImportStar):
                        for a in small.names:
                            from_names.add((a.asname.name if a.asname else a.name).value)
    assert load_env is not None
    base = _camel(path.stem)
    taken = set(module_names)

    def fresh(name: str) -> str:
        while name in taken:
            name += "V1"
        taken.add(name)
        return name

    N = {k: fresh(base + k) for k in ("Data", "Config", "Task", "Taskset")}

    renamer = _Rename(aliases)

    def ren(node):
        return node.visit(renamer)

    # ---- analyse load_environment ------------------------------------------------------------
    body = list(load_env.body.body)
    docstring = None
    if body and _is_docstring(body[0]):
        docstring = body.pop(0)
    ret = body[-1] if body and isinstance(body[-1], cst.SimpleStatementLine) and isinstance(body[-1].body[0], cst.Return) else None
    env_call = None
    env_stmt = None
    if ret is not None:
        body.pop()
        value = ret.body[0].value
        if isinstance(value, cst.Name):
            for s in reversed(body):
                if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign) and \
                        value.value in defined_names(s) and isinstance(s.body[0].value, cst.Call):
                    env_call, env_stmt = s.body[0].value, s
                    break
        elif isinstance(value, cst.Call):
            env_call = value
    if env_call is None:
        raise MigrationError(f"{path}: load_environment() must end with `return <Env>(...)` "
                             "(or return a variable assigned from one); migrate it by hand")
    if env_stmt is not None:
        body.remove(env_stmt)

    # env kind
    func = env_call.func
    env_name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    kind = ENV_KINDS.get(env_name)
    v0_class = None
    if kind is None and env_name in classes:
        v0_class = env_name
        for b in classes[env_name].bases:
            bname = b.value.attr.value if isinstance(b.value, cst.Attribute) else getattr(b.value, "value", "")
            kind = ENV_KINDS.get(bname, kind)
    plan = _Plan()
    if kind is None:
        kind = "multi"
        plan.manual.append((line(env_call), f"unknown environment class {env_name!r}: migrated as a multi-turn env; "
                            "check it"))
    plan.stateful = env_name == "StatefulToolEnv" or (v0_class is not None and any(
        _code(b.value).split(".")[-1] == "StatefulToolEnv" for b in classes[v0_class].bases))
    class_tools: list[str] = []
    if v0_class is not None:
        for item in classes[v0_class].body.body:
            if isinstance(item, cst.FunctionDef) and item.name.value == "setup_state":
                plan.setup_state = True
                add(item, "ENV009", MIGRATED, f"{v0_class}.setup_state → {N['Task']}.setup")
        for call in _calls(classes[v0_class], "add_tool"):
            fn = call.args[0].value if call.args else None
            if isinstance(fn, cst.Name) and fn.value in functions:
                class_tools.append(fn.value)
                skip = next((a.value for a in call.args[1:] if a.keyword is not None
                             and a.keyword.value == "args_to_skip"), None)
                if isinstance(skip, (cst.List, cst.Tuple)):
                    plan.skip[fn.value] = [e.value.evaluated_value for e in skip.elements
                                           if isinstance(e.value, cst.SimpleString)]
            elif call.args:
                plan.manual.append((line(call), "add_tool() of something that is not a module-level function: "
                                    "add it to the Toolset by hand"))
    kwargs = {a.keyword.value: a for a in env_call.args if a.keyword is not None}
    positional = [a for a in env_call.args if a.keyword is None and not a.star]
    if positional:
        plan.manual.append((line(env_call), "positional arguments to the environment constructor: pass them by name"))
    for k in kwargs:
        if k not in (*DATA_ARGS, "parser", "rubric", "tools", "max_turns"):
            add(env_call, "ENV900", INFO, f"environment option {k}= is kept on the compat env but vf does not use it")

    # ---- rubric ------------------------------------------------------------------------------
    rubric_arg = kwargs.get("rubric")
    rubric_call, rubric_var = None, None
    if rubric_arg is not None:
        if isinstance(rubric_arg.value, cst.Call):
            rubric_call = rubric_arg.value
        elif isinstance(rubric_arg.value, cst.Name):
            rubric_var = rubric_arg.value.value
            for s in body:
                if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign) and \
                        rubric_var in defined_names(s) and isinstance(s.body[0].value, cst.Call):
                    rubric_call = s.body[0].value
    if rubric_call is None:
        plan.manual.append((line(load_env), "no Rubric(...) found for rubric=: the migrated task has no rewards"))
    else:
        rname = rubric_call.func.attr.value if isinstance(rubric_call.func, cst.Attribute) else _code(rubric_call.func)
        if rname == "JudgeRubric":
            plan.judge = _judge_settings(rubric_call, load_env)
            add(rubric_call, "ENV010", MANUAL, f"JudgeRubric → {base}Judge (a vf.Judge) on the task config; check its "
                "prompt placeholders and how the rewards read the verdict")
        elif rname != "Rubric":
            plan.manual.append((line(rubric_call), f"{rname} has no compat equivalent; port it to @vf.reward "
                                "methods (a judge call inside a reward, or vf's math helpers)"))
        rargs = {a.keyword.value: a.value for a in rubric_call.args if a.keyword is not None}
        pos_args = [a.value for a in rubric_call.args if a.keyword is None]
        funcs = rargs.get("funcs", pos_args[0] if pos_args else None)
        weights = rargs.get("weights", pos_args[1] if len(pos_args) > 1 else None)
        items: list[tuple[cst.BaseExpression, str | None, bool]] = []
        if isinstance(funcs, cst.List):
            wl = weights.elements if isinstance(weights, cst.List) else None
            if weights is not None and wl is None:
                plan.manual.append((line(rubric_call), "weights are not a literal list: every reward gets "
                                    "weight 1.0; set the real weights in @vf.reward(weight=...)"))
            for i, el in enumerate(funcs.elements):
                w = _code(wl[i].value) if wl is not None and i < len(wl) else "1.0"
                items.append((el.value, w, False))
        elif funcs is not None:
            plan.manual.append((line(rubric_call), "funcs is not a literal list: add one @vf.reward per function"))
        if rubric_var:
            for s in body:
                if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr):
                    call = s.body[0].value
                    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
                            _code(call.func.value) == rubric_var and call.func.attr.value in ("add_reward_func", "add_metric"):
                        metric = call.func.attr.value == "add_metric"
                        fn = call.args[0].value
                        w = next((_code(a.value) for a in call.args[1:] if a.keyword is None or a.keyword.value == "weight"),
                                 "0.0" if metric else "1.0")
                        items.append((fn, w, metric))
        used = set(TASK_ATTRS)
        for i, (fn, w, metric) in enumerate(items):
            group = False
            if isinstance(fn, cst.Name):
                name = fn.value
                if name in functions:
                    params = {p.name.value for p in functions[name].params.params}
                    group = bool(params & PLURAL)
            elif isinstance(fn, cst.Call) and isinstance(fn.func, cst.Attribute) and fn.func.attr.value == "get_format_reward_func":
                name = "format_reward_func"
            else:
                name = f"reward_{i}"
            name = re.sub(r"\W", "_", name)
            while name in used:
                name += "_2"
            used.add(name)
            try:
                is_zero = float(w) == 0.0
            except ValueError:
                is_zero = False
                if not re.fullmatch(r"-?[\d.eE+-]+", w):
                    plan.manual.append((line(fn), f"weight of {name} is not a literal ({w}); set it by hand"))
                    w = "1.0"
            plan.funcs.append(_Func(i, name, w, metric or is_zero, line(fn), group))
            if group:
                add(fn, "ENV012", MANUAL, f"group reward {name} → Env.finalize over the episode's traces; v0 scored "
                    "the rollouts of one prompt together: check the grouping (e.g. --env.id best-of-n)")
            else:
                add(fn, "ENV003", MIGRATED,
                    f"reward function {name} (weight {w}) → @vf.{'metric' if metric or is_zero else 'reward'}")

    # ---- slice of load_environment for _v0_env() -----------------------------------------------
    env_expr = env_call.with_changes(args=[a for a in env_call.args
                                           if not (a.keyword is not None and a.keyword.value in DATA_ARGS) and a.star != "**"])
    if env_expr.args:
        env_expr = env_expr.with_changes(args=[*env_expr.args[:-1], env_expr.args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
    params = [p for p in load_env.params.params] + [p for p in load_env.params.kwonly_params]
    param_names = {p.name.value for p in params}
    needed = used_names(env_expr)
    slice_stmts = []
    for s in reversed(body):
        if defined_names(s) & needed:
            slice_stmts.insert(0, s)
            needed |= used_names(s)
    bound = sorted(needed & param_names, key=[p.name.value for p in params].index)

    # ---- module-level statements: imports, renames, flags --------------------------------------
    new_body = []
    tool_names: list[str] = list(class_tools)
    tools_arg = kwargs.get("tools")
    if tools_arg is not None:
        if isinstance(tools_arg.value, cst.List) and all(isinstance(e.value, cst.Name) and e.value.value in functions
                                                        for e in tools_arg.value.elements):
            tool_names += [e.value.value for e in tools_arg.value.elements if e.value.value not in tool_names]
            add(tools_arg, "ENV007", MIGRATED, f"tools {', '.join(tool_names)} → @vf.tool methods of {base}Tools")
        else:
            plan.manual.append((line(tools_arg), "tools are not a list of module-level functions: write a "
                                "vf.Toolset with @vf.tool methods by hand"))

    generated = _generate(N, base, kind, v0_class, plan, params, bound, kwargs, docstring, tool_names,
                          fresh, add, load_env, lambda n: _code(ren(n)))
    gen_module = cst.parse_module(generated)

    def fill(stmts):
        out = []
        for s in stmts:
            marker = (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr)
                      and isinstance(s.body[0].value, cst.Call) and isinstance(s.body[0].value.func, cst.Name)
                      and s.body[0].value.func.value)
            if marker in ("__VF_LOAD_BODY__", "__VF_PARTS_BODY__"):
                for x in body if marker == "__VF_LOAD_BODY__" else slice_stmts:
                    renamer.unknown = set()
                    new = ren(x)
                    if renamer.unknown:
                        names = ", ".join(sorted(renamer.unknown))
                        new = _flag(new, f"verifiers {names} has no vf equivalent; port it")
                        if marker == "__VF_LOAD_BODY__":
                            add(x, "ENV900", MANUAL, f"uses verifiers {names}")
                    out.append(new)
            elif marker == "__VF_ENV_EXPR__":
                out.append(cst.SimpleStatementLine([cst.Return(ren(env_expr))]))
            elif marker and marker.startswith("__VF_TOOL_"):
                name = marker[len("__VF_TOOL_"):-2]
                out.append(_tool_method(functions[name], plan.skip.get(name, ()), plan.stateful))
            elif isinstance(s, (cst.FunctionDef, cst.ClassDef)):
                out.append(s.with_changes(body=s.body.with_changes(body=fill(list(s.body.body)))))
            else:
                out.append(s)
        return out

    gen_stmts = fill(list(gen_module.body))
    gen_stmts[0] = gen_stmts[0].with_changes(
        leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *gen_module.header, *gen_stmts[0].leading_lines])
    imported_vf = [False, False]
    for stmt in mod.body:
        if stmt is load_env:
            new_body.extend(gen_stmts)
            continue
        if isinstance(stmt, cst.SimpleStatementLine) and any(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            new_body.extend(_rewrite_imports(stmt, add, line, imported_vf))
            continue
        renamer.unknown = set()
        new = ren(stmt)
        if renamer.unknown:
            new = _flag(new, f"verifiers {', '.join(sorted(renamer.unknown))} has no vf equivalent; port it")
            add(stmt, "ENV900", MANUAL, f"uses verifiers {', '.join(sorted(renamer.unknown))}")
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == v0_class and kind == "multi":
            add(stmt, "ENV006", MIGRATED, f"{v0_class}.env_response runs through {N['Task'][:-4]}Env (compat.MultiTurnAdapter)")
        new_body.append(new)
    if not any(isinstance(s, cst.SimpleStatementLine) and "__all__" in _code(s) for s in new_body):
        new_body.append(cst.parse_statement(f'__all__ = ["{N["Taskset"]}"]\n').with_changes(
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    for ln, msg in plan.manual:
        report.add(path, ln, "ENV900", MANUAL, msg)
    new_source = mod.with_changes(body=new_body).code
    report.change(path, source, new_source)
    return report


class MigrationError(ValueError):
    """A file that looks like a v0 environment but has no shape the codemod knows."""


def _rewrite_imports(stmt, add, line, imported_vf):
    out = []
    for small in stmt.body:
        if isinstance(small, cst.Import) and any(_code(a.name) == "verifiers" for a in small.names):
            rest = [a for a in small.names if _code(a.name) != "verifiers"]
            if rest:
                out.append(cst.SimpleStatementLine([small.with_changes(names=[*rest[:-1], rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])]))
            if not imported_vf[0]:
                out.append(cst.parse_statement("import vf\n"))
                imported_vf[0] = True
            if not imported_vf[1]:
                out.append(cst.parse_statement("from vf.migrate import compat\n"))
                imported_vf[1] = True
            add(stmt, "ENV008", MIGRATED, "import verifiers → import vf + vf.migrate.compat")
        elif isinstance(small, cst.ImportFrom) and small.module is not None and _code(small.module) == "verifiers":
            names = [] if isinstance(small.names, cst.ImportStar) else [a.name.value for a in small.names]
            new = cst.SimpleStatementLine([small.with_changes(module=cst.parse_expression("vf.migrate.compat"))])
            missing = [n for n in names if n not in SUPPORTED]
            if missing:
                new = _flag(new, f"verifiers {', '.join(missing)} has no vf equivalent; port it")
                add(stmt, "ENV900", MANUAL, f"imports verifiers {', '.join(missing)}")
            if not imported_vf[0]:
                out.append(cst.parse_statement("import vf\n"))
                imported_vf[0] = True
            if not imported_vf[1]:
                out.append(cst.parse_statement("from vf.migrate import compat\n"))
                imported_vf[1] = True
            out.append(new)
            add(stmt, "ENV008", MIGRATED, "from verifiers import ... → from vf.migrate.compat import ...")
        else:
            out.append(cst.SimpleStatementLine([small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]))
    if out:
        out[0] = out[0].with_changes(leading_lines=[*stmt.leading_lines, *out[0].leading_lines])
    return out


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


def _judge_settings(call: cst.Call, load_env: cst.FunctionDef) -> dict[str, str]:
    """The judge model and prompt as class-level expressions: literals and module names stay,
    a load_environment parameter becomes its default."""
    defaults = {p.name.value: p.default for p in [*load_env.params.params, *load_env.params.kwonly_params]}
    out = {"model": '"gpt-4.1-nano"', "prompt": "compat.JUDGE_PROMPT"}
    for a in call.args:
        if a.keyword is None or a.keyword.value not in ("judge_model", "judge_prompt"):
            continue
        value = a.value
        if isinstance(value, cst.Name) and value.value in defaults:
            value = defaults[value.value]
        if value is None:
            continue
        if isinstance(value, (cst.SimpleString, cst.ConcatenatedString, cst.Name, cst.Attribute)):
            out["model" if a.keyword.value == "judge_model" else "prompt"] = _code(value)
    return out


def _field_type(p: cst.Param) -> str:
    if p.annotation is not None:
        return _code(p.annotation.annotation)
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


def _generate(N, base, kind, v0_class, plan, params, bound, kwargs, docstring, tool_names, fresh, add, load_env,
              code) -> str:
    """The generated block (text with __VF_*__() markers that `fill` replaces by original code)."""
    L: list[str] = ["# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----", ""]
    if any(_field_type(p) == "typing.Any" for p in params):
        L += ["import typing", ""]
    L += [f"class {N['Data']}(vf.TaskData):", '    """One row of the v0 dataset."""', "",
          '    answer: str = ""', "    info: dict = {}", "", ""]
    task_config = "vf.TaskConfig"
    if plan.judge is not None:
        judge_cls, task_config = fresh(base + "Judge"), fresh(base + "TaskConfig")
        L += [f"# {TODO}: JudgeRubric → {judge_cls}: check the prompt's placeholders ({{question}}, {{answer}},",
              "# {response}) and how the rewards read the verdict",
              f"class {judge_cls}(vf.Judge[str]):",
              '    """The v0 JudgeRubric\'s judge: its reply text is what v0\'s `judge(...)` returned."""', "",
              f"    prompt = {plan.judge['prompt']}", "",
              "    def parse(self, response) -> str:", "        return response.text", "", "",
              f"class {task_config}(vf.TaskConfig):", f"    judge: vf.JudgeConfig = vf.JudgeConfig(model={plan.judge['model']})",
              "", ""]
    L += [f"class {N['Config']}(vf.TasksetConfig):",
          '    """The keyword arguments of the v0 load_environment()."""', ""]
    fields = []
    for p in params:
        name = p.name.value
        default = f" = {_code(p.default)}" if p.default is not None else ""
        fields.append(f"    {name}: {_field_type(p)}{default}")
    has_eval = "eval_dataset" in kwargs
    split_field = None
    if has_eval and "dataset" in kwargs:
        split_field = "split" if "split" not in {p.name.value for p in params} else "dataset_split"
        fields.append(f'    {split_field}: str = "eval"')
        fields.append('    """Which v0 dataset load() yields: "eval" (eval_dataset) or "train" (dataset)."""')
    if plan.judge is not None:
        fields.append(f"    task: {task_config} = {task_config}()")
    L += (fields or ["    pass"]) + ["", ""]
    add(load_env, "ENV001", MIGRATED, f"load_environment() → {N['Taskset']} (config {N['Config']}: "
        f"{', '.join(p.name.value for p in params) or 'no fields'})")
    if load_env.params.star_kwarg is not None:
        add(load_env, "ENV001", INFO, f"**{load_env.params.star_kwarg.name.value} of load_environment is dropped "
            "(v1 config fields are typed); env options it carried are run flags now (--max-turns, --sampling.*)")

    L += ["@compat.cache", "def _v0_env():",
          '    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards',
          '    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""']
    for name in bound:
        p = next(p for p in params if p.name.value == name)
        L.append(f"    {name} = {_code(p.default) if p.default is not None else 'None'}  # default of load_environment({name}=...)")
        add(load_env, "ENV001", INFO, f"the parser/rubric are rebuilt with load_environment's default {name}="
            f"{_code(p.default) if p.default is not None else 'None'}; a different --taskset.{name} does not reach them")
    L += ["    __VF_PARTS_BODY__()", "    __VF_ENV_EXPR__()", "", ""]

    state_cls = "vf.State"
    if plan.stateful or plan.setup_state:
        state_cls = fresh(base + "State")
        L += [f"class {state_cls}(vf.State):", '    """Per-rollout state: the v0 state dict, kept whole."""', "",
              "    v0_state: dict = {}", "", ""]
    tools_cls = None
    if tool_names:
        tools_cls = fresh(base + "Tools")
        generic = f"[vf.ToolsetConfig, {state_cls}]" if plan.stateful else ""
        L += [f"class {tools_cls}(vf.Toolset{generic}):", '    """The v0 ToolEnv tools, called unchanged."""', "",
              "    TOOL_PREFIX = None  # v0 tool names, unprefixed", ""]
        for t in tool_names:
            L += [f"    __VF_TOOL_{t}__()", ""]
        L += [""]
        if plan.stateful:
            add(load_env, "ENV011", MIGRATED, f"StatefulToolEnv → {tools_cls} (a Toolset with typed state "
                f"{state_cls}); update_tool_args fills {', '.join(sorted({a for v in plan.skip.values() for a in v})) or 'its'} "
                "hidden arguments")
    group = [f for f in plan.funcs if f.group]
    env_cls = None
    if kind == "multi" or group:
        env_cls = fresh(base + "Env")
        if kind == "multi":
            L += [f"class {env_cls}(compat.MultiTurnAdapter):",
                  f'    """Runs the v0 {v0_class or "environment"}\'s is_completed/env_response after each model reply."""', "",
                  "    v0_env = staticmethod(_v0_env)", ""]
            if v0_class is None:
                plan.manual.append((0, "a multi-turn env without a subclass: it has no env_response; check the Env"))
        else:
            L += [f"class {env_cls}(vf.Env):", '    """Scores the v0 group rewards over the episode\'s traces."""', ""]
        if group:
            L += ["    async def finalize(self, task, episode):",
                  f"        # {TODO}: v0 scored these over the rollouts of one prompt; here they score the traces",
                  "        # of one episode (one trace unless the env runs several, e.g. --env.id best-of-n)"]
            for f in group:
                L += [f"        await compat.group_score(_v0_env(), {f.index}, {f.name!r}, {f.weight}, task, episode)"]
            L += [""]
        L += [""]
    L += [f"class {N['Task']}(vf.Task[{N['Data']}, {state_cls}, {task_config}]):", ""]
    if tools_cls:
        L += [f"    toolsets = [{tools_cls}]", ""]
    if plan.setup_state:
        L += ["    async def setup(self, trace, state):", f'        """The v0 {v0_class}.setup_state."""',
              "        await compat.setup_state(_v0_env(), self.data, trace, state)", ""]
    if kind == "single":
        L += ["    @vf.stop", "    def single_turn(self, trace) -> bool:", "        return trace.num_turns >= 1", ""]
        add(load_env, "ENV005", MIGRATED, "SingleTurnEnv → @vf.stop single_turn")
    else:
        L += ["    @vf.stop", "    def max_turns(self, trace) -> bool:",
              "        limit = _v0_env().max_turns", "        return limit > 0 and trace.num_turns >= limit", ""]
    judge_arg = ""
    if plan.judge is not None:
        judge_arg = ", judge=compat.JudgeCall(" + judge_cls + "(self.config.judge), trace, _v0_env().rubric.parser)"
    for f in plan.funcs:
        if f.group:
            continue
        deco = "@vf.metric" if f.metric and float(f.weight or 0) == 0 else f"@vf.reward(weight={f.weight})"
        L += [f"    {deco}", f"    def {f.name}(self, task, trace, state):",
              f"        return _v0_env().score({f.index}, task, trace, state{judge_arg})", ""]
    L += ["", f"class {N['Taskset']}(vf.Taskset[{N['Task']}, {N['Config']}]):"]
    if docstring is not None:
        L += ["    " + _code(docstring.body[0].value), ""]
    if env_cls:
        L += [f"    ENV = {env_cls}", ""]
    L += ["    def load(self):"]
    body_names = set()
    for p in params:
        L.append(f"        {p.name.value} = self.config.{p.name.value}")
        body_names.add(p.name.value)
    L.append("        __VF_LOAD_BODY__()")
    ds = code(kwargs["dataset"].value) if "dataset" in kwargs else None
    eds = code(kwargs["eval_dataset"].value) if "eval_dataset" in kwargs else None
    if ds and eds:
        src = f'({eds} if self.config.{split_field} == "eval" else {ds})'
    else:
        src = ds or eds or "None"
    extra = "".join(f", {k}={code(kwargs[k].value)}" for k in ("system_prompt", "few_shot") if k in kwargs)
    L.append(f"        yield from compat.rows({src}, {N['Data']}{extra})")
    if "dataset" in kwargs or "eval_dataset" in kwargs:
        add(kwargs.get("dataset") or kwargs["eval_dataset"], "ENV002", MIGRATED,
            f"dataset rows → {N['Data']} (prompt/question, answer, info)")
    else:
        plan.manual.append((0, "no dataset= in the environment constructor: load() yields nothing"))
    todos = [f"# {TODO}: {msg}" + (f" (line {ln} of the v0 module)" if ln else "") for ln, msg in plan.manual]
    return "\n".join(L[:2] + todos + ([""] if todos else []) + L[2:]) + "\n"
