"""Tools the server runs for the model: harmony's built-in `browser` and `python`, and MCP tool
servers. `registry.ToolServers` is the entry point (`--tool-server LIST`)."""
