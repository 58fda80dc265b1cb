"""Toolsets over MCP: `server` serves a `vf.Toolset` (streamable HTTP), `client` starts or
reaches one and calls its tools. `vf.toolset.open_tools` is the entry point harnesses use."""
