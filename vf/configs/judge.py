"""verifiers 0.4's `verifiers.v1.configs.judge` import path: a judge's config and the
`TaskConfig.judges` list type (defined in `vf.judge`)."""

from vf.judge import JudgeConfig, Judges, resolve_judges

__all__ = ["JudgeConfig", "Judges", "resolve_judges"]
