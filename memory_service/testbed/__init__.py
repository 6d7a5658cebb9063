"""What the benchmarks (bench/), the evals (evals/) and the tests all stand on, so none imports another.

bench/ and evals/ import each other nothing: what both need lives here. The processes they start, each a
child of its own: service_runner (`memory-service serve` and llama-server), postgres (a throwaway
PostgreSQL cluster), chroma_server (a `chroma run` server), group (several services sharing those two).
The tests' fixtures start the same ones (tests/conftest.py), since the benchmarks need them too. What
they read and write: probes (RSS, /metrics, the machine), stats (percentiles, latency summaries, goals),
results (the JSON and the PNG figures). And the LoCoMo data set both measure recall on: locomo_data (its
conversations and questions), locomo_metrics (recall@k and the rest, scored against a question's turns).
"""
