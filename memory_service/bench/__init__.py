"""The benchmark suite, shipped with the package so `memory-service bench` works from an install.

Every benchmark talks to `memory-service serve` over real HTTP, in a process of its own:
extraction, remember, consolidation, recall, transfer, rss, limits, scale (each runnable alone with
`python -m memory_service.bench.<name>`), and cli (the whole suite, `memory-service bench`).
A benchmark too big for one module keeps its entry point there and its parts beside it
(recall_data, recall_loader, recall_measure; remember_load; transfer_data, transfer_timing,
transfer_forgotten). Shared helpers: service_runner (the service and llama-server processes),
stats (percentiles, goals), probes (RSS, /metrics, the machine), report (the shared command line
and JSON output), plots, texts.
Plots need matplotlib, the optional `bench` extra; without it the JSON results are unchanged.
"""
