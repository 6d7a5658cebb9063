"""`memory-service proxy`: an OpenAI-compatible chat endpoint in front of any model server, that gives each
session a brief of the team's memory at its start and saves what was said, without the agent calling a tool.

A client of the API (through `memory_service.client`): it imports no store, service or model. The modules,
one job each: `messages.py` (the chat wire: bounds, texts, the brief's place, the final answer),
`sessions.py` (who is talking, and each session's fixed brief), `brief.py` (the one recall at a session's
start, under a time limit), `saving.py` (the background save queue), `upstream.py` (forwarding, streamed),
`app.py` (the ASGI app). docs/proxy.md says what it promises.
"""
