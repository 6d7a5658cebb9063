"""One router per resource: memories, recall, transfer (export/import), limits and the handled ledger, keys, team, health."""
