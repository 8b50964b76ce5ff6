"""harmony's browser tool (tool.py) over a backend: offline documents (offline.py) or Exa (exa.py)."""
