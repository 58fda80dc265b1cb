"""Per-token RL losses, one module each (docs/losses.md). `ipo` is the default.

    from vf.trainer import losses
    loss_fn = losses.get("ipo")                     # or "icepop", "ppo", "cispo", "sft", "pkg.mod:fn"
    out = loss_fn(logprobs, inference_logprobs, advantages, loss_mask, eps=0.2)
    (out.loss / global_num_loss_tokens).backward()  # out.loss is a SUM over loss tokens
    metrics = losses.reduce_metrics(outputs_of_all_micro_batches)

A loss function takes 1-D per-token tensors — trainer log-probs (differentiable), inference
log-probs, advantages and a bool loss mask — plus keyword parameters, and returns a `LossOutput`
(`.loss`, mergeable `.stats`, `.metrics`). Each built-in module declares `DEFAULTS` (its accepted
parameters) and `validate`; `get` wraps it so unknown or out-of-range parameters raise
`LossConfigError` and missing ones take the defaults.

A custom loss is named by import path, "my_pkg.my_mod:my_loss". Its accepted parameters are its
keyword parameters after the four tensors (their defaults are its defaults; `**kwargs` accepts
anything); an optional `my_loss.validate(params) -> params` is called. It may return a
`LossOutput`, a `(loss, metrics)` pair (metrics are then averaged per micro-batch) or a bare loss.

This package imports torch only when a loss module is loaded (`get`/`defaults`), so configs can be
validated by name without it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vf.trainer.defaults import DEFAULT_LOSS

from vf.imports import import_plugin

from .base import LossConfigError, LossOutput, Stat, merge_stats, reduce_metrics, stat_value

__all__ = [
    "BUILTINS", "DEFAULT_LOSS", "Loss", "LossConfigError", "LossOutput", "Stat", "defaults", "get",
    "loss_token_mask", "merge_stats", "reduce_metrics", "resolve_params", "stat_value",
]

BUILTINS = ("ipo", "icepop", "ppo", "cispo", "sft")
_TENSOR_ARGS = 4


@dataclass(frozen=True)
class Loss:
    """A loss function with its declared parameters.

    Call: `loss(logprobs, inference_logprobs, advantages, loss_mask, **params) -> LossOutput`.
    """

    name: str
    fn: Callable[..., Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    validate: Callable[[dict], dict] | None = None
    accepts_any: bool = False  # custom loss with **kwargs
    per_token: bool = False
    """A sum of per-token terms, each a function of its own token's log-prob only: the trainer can
    then fuse it into the LM head (built-ins declare `PER_TOKEN = True`; a custom function may set
    `fn.per_token = True`)."""

    def resolve(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overlaid with `params`, validated. Raises LossConfigError."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.defaults))
        if unknown and not self.accepts_any:
            accepted = ", ".join(sorted(self.defaults)) or "none"
            raise LossConfigError(f"loss {self.name!r} got unknown parameter(s) {', '.join(unknown)}",
                                  hint=f"{self.name} accepts: {accepted}")
        full = {**self.defaults, **params}
        missing = sorted(k for k, v in full.items() if v is inspect.Parameter.empty)
        if missing:
            raise LossConfigError(f"loss {self.name!r} needs parameter(s) {', '.join(missing)}")
        if self.validate is not None:
            checked = self.validate(full)
            full = {**full, **(checked or {})}
        return full

    def __call__(self, logprobs, inference_logprobs, advantages, loss_mask, **params) -> LossOutput:
        return self.apply(logprobs, inference_logprobs, advantages, loss_mask, self.resolve(params))

    def apply(self, logprobs, inference_logprobs, advantages, loss_mask,
              resolved: dict[str, Any]) -> LossOutput:
        """The loss with parameters `resolve` already returned: the trainer validates them once a
        step, not once for every micro-batch and fused chunk."""
        return _as_output(self.fn(logprobs, inference_logprobs, advantages, loss_mask, **resolved), self.name)


def _as_output(out: Any, name: str) -> LossOutput:
    if isinstance(out, LossOutput):
        return out
    metrics: dict[str, Any] = {}
    if isinstance(out, tuple) and len(out) == 2:
        out, metrics = out
    if not hasattr(out, "dim") or out.dim() != 0:
        raise TypeError(f"loss {name!r} must return a LossOutput, (loss, metrics) or a 0-dim tensor; "
                        f"got {type(out).__name__}")
    stats = {k: Stat(v.detach() if hasattr(v, "detach") else v, 1, "mean") for k, v in metrics.items()}
    return LossOutput(loss=out, stats=stats)


def _builtin(name: str) -> Loss:
    mod = importlib.import_module(f"{__name__}.{name}")
    return Loss(name=name, fn=mod.loss, defaults=dict(mod.DEFAULTS), validate=mod.validate,
                per_token=bool(getattr(mod, "PER_TOKEN", False)))


def _custom(path: str) -> Loss:
    mod_name, _, attr = path.partition(":")
    if not mod_name or not attr:
        raise LossConfigError(f"custom loss {path!r} must look like 'package.module:function'")
    try:  # the plugin grammar every resolver shares (vf.imports.import_plugin)
        mod, _ = import_plugin("loss", path)
    except ImportError as e:
        raise LossConfigError(f"cannot import custom loss module {mod_name!r}: {e}",
                              hint="is the package installed in this environment?") from e
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise LossConfigError(f"module {mod_name!r} has no attribute {attr!r} (custom loss {path!r})")
    if not callable(fn):
        raise LossConfigError(f"custom loss {path!r} is not callable")
    params = list(inspect.signature(fn).parameters.values())
    if len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) < _TENSOR_ARGS:
        raise LossConfigError(
            f"custom loss {path!r} must take (logprobs, inference_logprobs, advantages, loss_mask, **params)")
    declared = {p.name: p.default for p in params[_TENSOR_ARGS:]
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params)
    return Loss(name=path, fn=fn, defaults=declared, validate=getattr(fn, "validate", None),
                accepts_any=accepts_any, per_token=bool(getattr(fn, "per_token", False)))


def get(name: str | None = None) -> Loss:
    """The loss called `name` (a built-in or 'pkg.mod:fn'); None means DEFAULT_LOSS."""
    name = DEFAULT_LOSS if name is None else name
    if name in BUILTINS:
        return _builtin(name)
    if ":" in name:
        return _custom(name)
    raise LossConfigError(f"unknown loss {name!r}; built-in losses: {', '.join(BUILTINS)}",
                          hint="or name a custom loss by import path, e.g. 'my_pkg.my_losses:my_loss'")


def defaults(name: str | None = None) -> dict[str, Any]:
    """Default parameters of a loss (a copy)."""
    return dict(get(name).defaults)


def resolve_params(name: str | None, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate a loss config up front: defaults overlaid with `params`; raises LossConfigError."""
    return get(name).resolve(params)


def loss_token_mask(inference_logprobs, loss_mask, advantages=None, logprobs=None):
    """Bool mask of usable loss tokens (finite inputs); use it to count the global denominator
    before the forward pass. See common.loss_token_mask."""
    from .common import loss_token_mask as _mask

    return _mask(inference_logprobs, loss_mask, advantages, logprobs)
