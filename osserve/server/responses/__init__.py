"""OpenAI's Responses API over harmony: `route.py` (the endpoints), `request_tools.py` (a request's
tools: functions, the built-in browser and python, MCP servers), `loop.py` (generate, run the
server's tools the model calls, generate on), `output.py` (output items and their stream events)
and `items.py` (input items as chat messages). Each conversation's live tool state is kept by
osserve/tools/conversations.py."""
