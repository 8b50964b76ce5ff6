"""harmony's python tool: stateful sessions (session.py) of a worker (worker.py) in a kernel
sandbox (sandbox.py); tool.py is what the registry holds."""
