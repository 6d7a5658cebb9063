"""The `memory-service` command line, one module per topic.

- main.py: `main()` and the parser, assembled from the modules below (also `python -m memory_service`);
- serve.py: `serve` (llama-server and the API) and `llama-server` (one pool member on its own);
- memories.py: remember, recall, get, list, forget, through a running service over HTTP (waiting.py: `remember
  --wait`); transfer.py: export, import; render.py: what they print for a person (`--json`: the service's JSON);
- limits.py: `limits`, daily limits and the handled ledger over HTTP, with exit codes meant for scripts;
- keys.py: `keys`, API keys in the key store (no service needed, no restart after a change);
- data.py: doctor, backup, restore, reindex, migrate: work on the data dir and the model server directly;
- reindex.py: the vector rebuild itself, shared by `reindex` and `migrate`;
- harness.py: `mcp`, the memory tools for agent harnesses; gate.py: `gate`, an MCP server's tools behind the
  handled ledger and daily limits; measure.py: `bench` and `eval`;
- common.py: the flags and printing the commands share; errors.py: the one error handler and the exit codes.

Heavy imports (uvicorn, the app, the stores, the model runtime) happen inside the commands that need them,
so a call such as `memory-service recall` starts quickly.
"""
