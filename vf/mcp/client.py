"""The old import path of vf.episode.served_tools (the MCP servers a rollout's served toolsets
run in): kept so `from vf.mcp.client import serve_toolset` works. Not part of the authoring API."""

from vf.episode.served_tools import RemoteTools, program_tool_urls, serve_toolset, start_server

__all__ = ["RemoteTools", "program_tool_urls", "serve_toolset", "start_server"]
