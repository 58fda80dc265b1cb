"""Toolsets over MCP: `server` serves a `vf.Toolset` (streamable HTTP; `Toolset.run()`), and holds
what serving a tool call means in-process too. Starting or reaching served toolsets for a rollout
is the episode core's (vf.episode.served_tools; `vf.mcp.client` is its old import path), and
`vf.episode.tools.open_tools` is the entry point the in-process harnesses use."""
