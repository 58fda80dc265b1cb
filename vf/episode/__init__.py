"""The episode core: the machinery that runs what an environment author writes with `import vf`.

Two floors. The authoring API (vf.types, vf.rows, vf.trace, vf.taskset, vf.toolset, vf.judge,
vf.env, vf.harness, vf.config, ...) sits below and never imports this package, not even inside
a function (tests/test_layering.py guards it). This package sits above it, one module per job:

    hooks        calling a task's hooks with the arguments they name
    scoring      metrics, rewards, plugged judges
    intercept    `@vf.intercept` hooks and call-boundary stops around every model call
    tools        one rollout's tool runner (in-process toolsets, served ones via served_tools)
    served_tools MCP servers vf starts or reaches for served toolsets
    harnesses    the in-process harnesses (`null`, `bash`), harness-id resolution, `seat_for`
    rollout      one seat's rollout: its stages, its trace, its one model-call path (`Rollout.call`)
    loop         the in-process seat: the chat loop and its tool calls, through `Rollout.call`
    program      the program seat: a program harness's intercepted calls, through `Rollout.call`
    agents       Agent / Agents / Interaction: what an env's `run` drives
    runner       episodes and plans: `run_episode`, `run_plan`
    loading      taskset ids, their Env, built-in envs

This file imports nothing, so importing one module of the core does not import the rest.
"""
