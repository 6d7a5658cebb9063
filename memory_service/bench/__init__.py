"""The benchmark suite, shipped with the package so `memory-service bench` works from an install.

Every benchmark talks to `memory-service serve` over real HTTP, in a process of its own:
common (shared helpers: service and llama-server runners, percentiles, goals, plots),
extraction, remember, recall, transfer, rss, limits (each runnable alone with
`python -m memory_service.bench.<name>`), and cli (the whole suite, `memory-service bench`).
Plots need matplotlib, the optional `bench` extra; without it the JSON results are unchanged.
"""
