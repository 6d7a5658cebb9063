"""`memory-service mcp`: the service's tools for agent harnesses, over the Model Context Protocol.

It talks to a running service through `memory_service.client` (URL and key from the environment), so
it serves a local service or a remote one alike, over stdio or streamable HTTP.
"""
