"""Typed config sections with verifiers 0.4's import paths (`vf.configs.harness`, `vf.configs.judge`)."""
