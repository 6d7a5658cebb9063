"""Adapters that let agent frameworks keep their memory in this service, over the Python client.

Each module here imports only `client/` and `contract/` of this package (tests/test_layout.py), plus its
framework, which an extra installs (`pip install 'memory-service[langgraph]'`): the base install never grows.
"""
