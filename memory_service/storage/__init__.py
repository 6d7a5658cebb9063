"""SQL (SQLite or PostgreSQL) and Chroma only: the journal, limits, keys, vectors, and datadir.py, which names the data dir's files and opens its stores. It imports no stage above it."""
