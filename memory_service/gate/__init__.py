"""`memory-service gate`: an MCP server in front of any other MCP server, whose guarded tools cannot run twice
for one item nor past a daily limit.

The promise is kept by the service's own handled ledger and daily limits (`/v1/gate/reserve|finish|release`),
not by the agent's model remembering to call a memory tool: a guarded call reserves its key and units, runs the
upstream tool only when the reservation is granted, then records the key handled or, when the tool failed,
releases the key and refunds the units.

- policy.py: the policy file (TOML), read and checked at start;
- upstream.py: the fronted MCP server, started as a subprocess and spoken to over stdio;
- guard.py: one guarded call (reserve, run, finish or release), and what the model reads when it is refused;
- server.py: the MCP server the harness sees (stdio or streamable HTTP, as `memory-service mcp`).

Like the MCP server, the gate is a client of the API: no store, no service, no model.
"""
