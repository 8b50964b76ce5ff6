"""What the README's main command shows once the server is up (`osserve serve --showcase`):
requests to the built-in demo model, printed as a newcomer would want to see them.

1. A question: the reply's reasoning (the `analysis` channel) and its final answer.
2. A tool round trip: the model calls `get_weather`, the showcase runs the (fake) tool and sends
   the result back, and the model answers with it.
3. A python round trip through the Responses API, with the server's own tools (`--tool-server
   demo`, as scripts/serve.sh starts it): the server runs the model's python call in its sandbox
   and the model answers with the output. The shipped demo weights never learned the python tool
   (its corpus has it since corpus 2; scripts/train_demo_gpu.sh retrains): the call is forced
   (`tool_choice: {"type": "code_interpreter"}`), and whatever the model writes as code, and the
   sandbox answers, is shown as it is.

Plain HTTP (httpx) against /v1/chat/completions and /v1/responses, exactly what any OpenAI client
sends.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from osserve.demo.corpus import TIME_TOOL, WEATHER_TOOL
from osserve.demo.evaluate import fake_service
from osserve.harmony.render import FunctionTool

QUESTION = "What is 37 + 45?"
TOOL_QUESTION = "What is the weather in Paris?"
PYTHON_QUESTION = "What is 123 * 456?"


def chat_tools(tools: list[FunctionTool]) -> list[dict[str, Any]]:
    """Function tools as a Chat Completions request declares them."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]


TOOLS = chat_tools([WEATHER_TOOL, TIME_TOOL])


@dataclass
class ShowcaseResult:
    reasoning: str = ""
    answer: str = ""
    tool_call: dict[str, Any] = field(default_factory=dict)  # {"name", "arguments"}
    tool_result: dict[str, Any] = field(default_factory=dict)
    tool_answer: str = ""
    python: dict[str, Any] = field(default_factory=dict)  # the code_interpreter_call item, where one ran
    python_answer: str = ""


def wait_until_up(base: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server at {base} did not come up in {timeout:.0f} s")
        time.sleep(0.2)


def run_showcase(base: str, model: str, api_key: str | None = None,
                 say: Callable[[str], None] = print) -> ShowcaseResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 200, **extra}
        r = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=120)
        r.raise_for_status()
        message: dict[str, Any] = r.json()["choices"][0]["message"]
        return message

    logging.getLogger("httpx").setLevel(logging.WARNING)  # its per-request lines would split the transcript
    out = ShowcaseResult()
    say(f"\n── showcase: POST {base}/v1/chat/completions ──")
    say(f"user:      {QUESTION}")
    m = chat([{"role": "user", "content": QUESTION}])
    out.reasoning, out.answer = m.get("reasoning") or "", m.get("content") or ""
    say(f"reasoning: {out.reasoning}")
    say(f"answer:    {out.answer}")

    say(f"\nuser:      {TOOL_QUESTION}   (tools: get_weather, get_time)")
    messages: list[dict[str, Any]] = [{"role": "user", "content": TOOL_QUESTION}]
    m = chat(messages, tools=TOOLS)
    calls = m.get("tool_calls") or []
    if not calls:
        say(f"(no tool call; the model answered: {m.get('content')!r})")
        return out
    fn = calls[0]["function"]
    out.tool_call = {"name": fn["name"], "arguments": fn["arguments"]}
    say(f"reasoning: {m.get('reasoning') or ''}")
    say(f"tool call: {fn['name']}({fn['arguments']})")
    out.tool_result = fake_service(fn["name"], json.loads(fn["arguments"]))
    say(f"tool:      {json.dumps(out.tool_result)}")
    messages += [{"role": "assistant", "content": None, "tool_calls": calls},
                 {"role": "tool", "tool_call_id": calls[0]["id"], "content": json.dumps(out.tool_result)}]
    m = chat(messages, tools=TOOLS)
    out.tool_answer = m.get("content") or ""
    say(f"answer:    {out.tool_answer}\n")
    python_round_trip(base, model, headers, out, say)
    return out


def why_forced(model: str) -> str:
    """Why the showcase's python answer may be nonsense: said where the built-in model is served
    with weights trained before the python tool (corpus 1)."""
    from osserve.demo.compact import corpus_version
    from osserve.demo.weights import BUILTIN_NAME, DEMO_WEIGHTS

    if model == BUILTIN_NAME and corpus_version(DEMO_WEIGHTS) < 2:
        return ": the shipped demo weights predate the python tool"
    return ""


def python_round_trip(base: str, model: str, headers: dict[str, str], out: ShowcaseResult,
                      say: Callable[[str], None]) -> None:
    """The server's python tool through /v1/responses (see the module docstring)."""
    say(f"── showcase: POST {base}/v1/responses ──")
    say(f"user:      {PYTHON_QUESTION}   (tools: code_interpreter; the call forced{why_forced(model)})")
    body = {"model": model, "input": PYTHON_QUESTION, "temperature": 0, "max_output_tokens": 300,
            "reasoning": {"effort": "low"}, "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
            "tool_choice": {"type": "code_interpreter"}, "max_tool_calls": 1}
    r = httpx.post(base + "/v1/responses", json=body, headers=headers, timeout=300)
    if r.status_code == 400:
        say(f"(no python round trip: {r.json()['error']['message']})\n")
        return
    r.raise_for_status()
    for item in r.json()["output"]:
        if item["type"] == "reasoning":
            say(f"reasoning: {''.join(c['text'] for c in item['content'])}")
        elif item["type"] == "code_interpreter_call":
            out.python = item
            logs = "".join(o.get("logs", "") for o in item.get("outputs") or [])
            say(f"python:    {item['code']}")
            say("output:    " + logs.rstrip("\n").replace("\n", "\n           "))
        elif item["type"] == "message":
            out.python_answer = "".join(c["text"] for c in item["content"])
            say(f"answer:    {out.python_answer}")
    say("")
