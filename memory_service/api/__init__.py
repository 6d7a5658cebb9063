"""The HTTP edge: the app factory, bearer auth to team and role, request ids, connection guards, the one error mapping (errors.py), and routes/. It holds no business logic: routes call Services."""
