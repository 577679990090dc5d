"""MCP: the agent API as tools over the Streamable HTTP transport."""
