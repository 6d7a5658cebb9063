"""The benchmark suite, shipped with the package so `memory-service bench` works from an install.

Every benchmark talks to `memory-service serve` over real HTTP, in a process of its own:
extraction, remember, consolidation, recall, transfer, rss, limits, scale (each runnable alone with
`python -m memory_service.bench.<name>`), and cli (the whole suite, `memory-service bench`).
A benchmark too big for one module keeps its entry point there and its parts beside it
(recall_data, recall_loader, recall_measure; remember_load; transfer_data, transfer_timing,
transfer_forgotten). Helpers: report (the shared command line and its output), texts; what the
evals and the tests use too (the service and llama-server processes, PostgreSQL, a Chroma server,
stats, probes, JSON and PNG output) is in testbed/.
Plots need matplotlib, the optional `bench` extra; without it the JSON results are unchanged.
"""
