"""Parsing text that may be hostile (configs, run-dir files, HTTP bodies, shard indexes) with
bounds, so a small input cannot take unbounded memory, time or stack.

    load_json(text, max_depth=MAX_DEPTH, allow_nan=False) -> value  # BoundsError on bad / too deep JSON
    load_yaml(text, max_depth=..., max_nodes=...) -> value # BoundsError on alias bombs, depth
    check_tree(value, max_depth)                           # BoundsError past max_depth levels,
                                                           # or on a lone surrogate in a string

`BoundsError` is a ValueError with a message fit to show a user; callers turn it into their own
error (a UsageError, exit 2; an HTTP 400; a ModelLoadError).

Why: Python's json raises RecursionError (a bug-looking traceback, or a 500) on deep nesting and
reads NaN/Infinity (and 1e999 as inf), which JSON does not have, and lone surrogates
("\\ud800") that no encoder can write back; PyYAML composes aliases by reference, so a 1 KB
"billion laughs" file loads quickly and explodes later when anything walks or serialises it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

MAX_DEPTH = 64
"""Nesting levels a config, body or index may have (real ones have under 10)."""
MAX_YAML_NODES = 1_000_000
"""Nodes a YAML document may have once every alias is expanded (a 1 MiB file without aliases has
fewer than 300k)."""


class BoundsError(ValueError):
    pass


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_tree(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """BoundsError when lists/dicts nest deeper than `max_depth`, or a string (or key) holds a
    lone UTF-16 surrogate (valid as a JSON escape, but no text encoding can write it)."""
    stack = [(value, 1)]
    while stack:  # iterative: no recursion
        v, depth = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise BoundsError(f"string {v[:40]!r} holds a lone UTF-16 surrogate (not text)")
            continue
        if isinstance(v, dict):
            v = [*v.keys(), *v.values()]
        elif not isinstance(v, list):
            continue
        if depth > max_depth:
            raise BoundsError(f"nested deeper than {max_depth} levels")
        stack.extend((c, depth + 1) for c in v if isinstance(c, (dict, list, str)))


def _no_constant(name: str):
    raise BoundsError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise BoundsError(f"number {text[:40]} is out of range")
    return value


def load_json(text: str | bytes, max_depth: int = MAX_DEPTH, allow_nan: bool = False) -> Any:
    """Strict JSON (no NaN/Infinity) nested at most `max_depth` levels; BoundsError otherwise
    (its message says where, as json does). `allow_nan` reads NaN/Infinity as floats: for files
    vf itself writes with json.dumps (metrics, batches, checkpoints), where a NaN mean is data."""
    strict = {} if allow_nan else {"parse_constant": _no_constant, "parse_float": _finite}
    try:
        value = json.loads(text, **strict)
    except RecursionError:
        raise BoundsError(f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise BoundsError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise BoundsError(f"not valid JSON (not UTF-8: {e.reason} at byte {e.start})") from None
    check_tree(value, max_depth)
    return value


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses, before constructing anything, a document nested deeper than
    `max_depth` or with more than `max_nodes` nodes once aliases are expanded (and recursive
    aliases, which nothing downstream can serialise)."""

    max_depth = MAX_DEPTH
    max_nodes = MAX_YAML_NODES

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        # composing is recursive in PyYAML: stop before a deep document exhausts the stack
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise BoundsError(f"nested deeper than {self.max_depth} levels (line {self.peek_event().start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):
        self._check_expanded(node)
        return super().construct_document(node)

    def _check_expanded(self, root) -> None:
        """Count nodes and depth as if every alias were copied, visiting each distinct node once."""
        sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded depth)
        active: set[int] = set()

        def too_deep(node):
            return BoundsError(f"nested deeper than {self.max_depth} levels once aliases are expanded "
                               f"(line {node.start_mark.line + 1})")

        def visit(node, depth: int) -> tuple[int, int]:
            if depth > self.max_depth:  # also bounds this recursion
                raise too_deep(node)
            key = id(node)
            if key in sizes:
                nodes, height = sizes[key]
            else:
                if key in active:
                    raise BoundsError(f"recursive alias (line {node.start_mark.line + 1})")
                active.add(key)
                children = node.value if isinstance(node, yaml.SequenceNode) else \
                    [c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode) else []
                nodes, height = 1, 1
                for child in children:
                    n, h = visit(child, depth + 1)
                    nodes, height = nodes + n, max(height, h + 1)
                    if nodes > self.max_nodes:
                        raise BoundsError(f"more than {self.max_nodes} values once aliases are expanded "
                                          f"(an alias bomb? line {node.start_mark.line + 1})")
                active.discard(key)
                sizes[key] = nodes, height
            if depth + height - 1 > self.max_depth:
                raise too_deep(node)
            return nodes, height

        visit(root, 1)


def load_yaml(text: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_YAML_NODES) -> Any:
    """yaml.safe_load with limits: BoundsError past `max_depth` levels or `max_nodes` expanded
    values; yaml.YAMLError for text that is not YAML."""
    loader = type("Loader", (_BoundedLoader,), {"max_depth": max_depth, "max_nodes": max_nodes})(text)
    try:
        value = loader.get_single_data()
        check_tree(value, max_depth)
        return value
    except RecursionError:  # a stack smaller than max_depth needs (deep flow collections in the scanner)
        raise BoundsError(f"nested deeper than {max_depth} levels") from None
    finally:
        loader.dispose()
