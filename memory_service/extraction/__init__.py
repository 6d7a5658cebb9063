"""One extraction attempt, free of storage: the small-talk gate, sizing to context and budget, the prompt beside its schema, the llama-server client, parsing, grounding, coverage and dates."""
