"""Scoring the demo model on held-out prompts: exact final answers and valid tool calls.

`evaluate(ask, examples)` drives any chat backend through an `ask` function that answers a batch
of requests: the offline LLM (`llm_asker`, used after training) or the HTTP server through the
official `openai` client (the test). A tool-using prompt takes two turns: the model must call a
declared tool with JSON arguments valid for its schema; the evaluation then runs the tool (a fixed
fake service) and sends the result back, and the model's final answer must use it exactly. A
multiplication with python declared (corpus 2) takes two turns the same way: the model must call
`python`, the evaluation runs the call (`print(a * b)` is all its fake python knows) and the answer
must use what it printed. The held-out prompts are drawn from the corpus the checkpoint was
trained on (`corpus_version` in its metadata).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osserve.demo.corpus import CORPUS_VERSION, Example, draw_examples, time_result, tool_answer, weather_result
from osserve.harmony.render import ChatMessage, Effort, FunctionTool, ToolCall


@dataclass
class AskRequest:
    messages: list[ChatMessage]
    tools: list[FunctionTool]
    effort: Effort
    python: bool = False  # the built-in python tool is declared (only backends that can: the offline LLM)


@dataclass
class Reply:
    content: str
    tool_calls: list[tuple[str, str]]  # (function name, arguments as written)


Ask = Callable[[list[AskRequest]], list[Reply]]


@dataclass
class EvalReport:
    prompts: int = 0
    answers_right: int = 0
    tool_calls_expected: int = 0
    tool_calls_valid: int = 0
    failures: list[str] = field(default_factory=list)
    by_task: dict[str, list[int]] = field(default_factory=dict)  # task -> [right, prompts]

    def count(self, task: str, right: bool) -> None:
        tally = self.by_task.setdefault(task, [0, 0])
        tally[0] += right
        tally[1] += 1

    @property
    def answer_rate(self) -> float:
        return self.answers_right / max(1, self.prompts)

    @property
    def tool_call_valid_rate(self) -> float:
        return self.tool_calls_valid / max(1, self.tool_calls_expected)

    def summary(self) -> str:
        return (f"{self.answers_right}/{self.prompts} final answers exactly right ({self.answer_rate:.1%}); "
                f"{self.tool_calls_valid}/{self.tool_calls_expected} tool calls valid JSON for the declared "
                f"schema ({self.tool_call_valid_rate:.1%})")

    def by_task_summary(self) -> str:
        """Each task's prompts answered exactly right (a tool task: the call, then the answer)."""
        return ", ".join(f"{task} {r}/{n}" for task, (r, n) in sorted(self.by_task.items()))


SECOND_TURNS = ("tool_answer", "python_answer")
PYTHON_TASKS = ("python_call", "python_answer", "no_python")


def heldout_examples(n: int, seed: int = 2026, effort: Effort | None = "medium", version: int = CORPUS_VERSION,
                     python: bool = False) -> list[Example]:
    """n first-turn prompts whose user text training never saw (corpus.split_of): the python ones
    (multiplications, with python declared or not, and questions beside a declared python) with
    python=True, the others without."""
    pool = draw_examples(random.Random(seed), (12 if python else 4) * n, "heldout", version)
    firsts = [ex for ex in pool if ex.task not in SECOND_TURNS
              and (ex.task in PYTHON_TASKS or ex.python) == python][:n]
    for ex in firsts:
        ex.effort = effort or ex.effort
    return firsts


def fake_python(code: str) -> str:
    """What the evaluation's python prints: a product written as the corpus writes it, else an error."""
    m = re.fullmatch(r"\s*print\((\d+) \* (\d+)\)\s*", code)
    if m is None:
        return "SyntaxError: the evaluation runs print(a * b) only\n"
    return f"{int(m.group(1)) * int(m.group(2))}\n"


def fake_service(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The tools' results: a fixed function of the call, so runs are repeatable."""
    city = str(arguments.get("city", arguments.get("location", "")))
    rng = random.Random(f"{name}:{city}")
    return (weather_result if name == "get_weather" else time_result)(city, rng)


def valid_call(name: str, arguments: str, tools: list[FunctionTool]) -> dict[str, Any] | None:
    """The parsed arguments when the call names a declared tool and matches its schema, else None."""
    tool = next((t for t in tools if t.name == name), None)
    if tool is None or tool.parameters is None:
        return None
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    props = tool.parameters.get("properties", {})
    if not isinstance(args, dict) or set(args) - set(props) or set(tool.parameters.get("required", [])) - set(args):
        return None
    if any(props[k].get("type") == "string" and not isinstance(v, str) for k, v in args.items()):
        return None
    return args


def evaluate(ask: Ask, examples: list[Example]) -> EvalReport:
    report = EvalReport(prompts=len(examples))
    replies = ask([AskRequest(ex.messages, ex.tools, ex.effort, ex.python) for ex in examples])
    second: list[tuple[Example, str, AskRequest]] = []
    for ex, reply in zip(examples, replies, strict=True):
        if ex.task == "python_call":
            report.tool_calls_expected += 1
            code = next((arguments for name, arguments in reply.tool_calls if name == "python"), None)
            if code is None or len(reply.tool_calls) != 1:
                report.failures.append(f"{ex.user_text!r}: wanted one python call, got {reply}")
                report.count(ex.task, False)
                continue
            report.tool_calls_valid += 1
            call = ToolCall("ci_0", "python", code, recipient="python", channel="analysis")
            messages = ex.messages + [ChatMessage("assistant", None, tool_calls=[call]),
                                      ChatMessage("tool", fake_python(code), tool_call_id=call.id)]
            a, b = ex.extra["a"], ex.extra["b"]
            second.append((ex, f"{a} * {b} = {a * b}.", AskRequest(messages, ex.tools, ex.effort, True)))
            continue
        if ex.tool_call is None:
            right = reply.content == ex.answer and not reply.tool_calls
            report.count(ex.task, right)
            if right:
                report.answers_right += 1
            else:
                got = f"{reply.content[:120]!r} {reply.tool_calls}"
                report.failures.append(f"{ex.user_text!r}: wanted {ex.answer!r}, got {got}")
            continue
        report.tool_calls_expected += 1
        if len(reply.tool_calls) != 1:
            report.failures.append(f"{ex.user_text!r}: wanted one tool call, got {reply}")
            report.count(ex.task, False)
            continue
        name, arguments = reply.tool_calls[0]
        args = valid_call(name, arguments, ex.tools)
        if args is None:
            report.failures.append(f"{ex.user_text!r}: invalid call {name}({arguments})")
            report.count(ex.task, False)
            continue
        report.tool_calls_valid += 1
        result = fake_service(name, args)
        call = ToolCall("call_0", name, arguments)
        messages = ex.messages + [ChatMessage("assistant", None, tool_calls=[call]),
                                  ChatMessage("tool", json.dumps(result), tool_call_id=call.id)]
        expected = tool_answer(ex.extra["kind"], fake_service(ex.extra["kind"], {"city": ex.extra["city"]}))[1]
        second.append((ex, expected, AskRequest(messages, ex.tools, ex.effort, ex.python)))
    for (ex, expected, _), reply in zip(second, ask([r for _, _, r in second]), strict=True):
        right = reply.content == expected and not reply.tool_calls
        report.count(ex.task, right)
        if right:
            report.answers_right += 1
        else:
            got = reply.content[:120]
            report.failures.append(f"{ex.user_text!r} (after the tool): wanted {expected!r}, got {got!r}")
    return report


def llm_asker(llm: Any, max_tokens: int = 160) -> Ask:
    """Batched greedy answers from an offline `osserve.engine.llm.LLM`."""
    from osserve.engine.core.sampling_params import SamplingParams
    from osserve.harmony.render import ToolNamespaces, render_chat
    from osserve.harmony.stream import parse_completion
    from osserve.tools.python.sandbox import SandboxLimits
    from osserve.tools.python.tool import python_namespace

    def ask(requests: list[AskRequest]) -> list[Reply]:
        prompts = [render_chat(r.messages, tools=r.tools, reasoning_effort=r.effort,
                               namespaces=ToolNamespaces(builtin=[python_namespace(SandboxLimits())]) if r.python
                               else None) for r in requests]
        outs = llm.generate([p.token_ids for p in prompts], SamplingParams(temperature=0.0, max_tokens=max_tokens))
        replies = []
        for out in outs:
            parsed = parse_completion(out.token_ids)
            replies.append(Reply(parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls]))
        return replies

    return ask



def main(argv: list[str] | None = None) -> None:
    """`python -m osserve.demo.evaluate --compact FILE [--n 200] [--device cuda] [--corpus 2]
    [--efforts medium] [--kv-cache-dtype fp8]`: expand a compact checkpoint into a temporary folder and
    score it with the offline engine, on the corpus it was trained on unless --corpus names another (to
    compare checkpoints of two corpora on the same prompts)."""
    import argparse
    import tempfile

    from osserve.demo.compact import corpus_version, expand_compact
    from osserve.engine.llm import LLM

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--compact", required=True)
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--device", default=None)
    p.add_argument("--show-failures", type=int, default=10)
    p.add_argument("--corpus", type=int, default=None, help="the corpus of the prompts (default: the trained one)")
    p.add_argument("--efforts", default="medium,low,high", help="comma-separated reasoning efforts to score")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto, or fp8 (e4m3 with scales)")
    a = p.parse_args(argv)
    version = a.corpus or corpus_version(a.compact)
    print(f"{a.compact}: trained on corpus {corpus_version(a.compact)}; prompts from corpus {version}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(model=str(expand_compact(a.compact, tmp)), device=a.device, max_model_len=1024,
                  kv_cache_dtype=a.kv_cache_dtype)
        for effort in a.efforts.split(","):
            for python in (False, True) if version >= 2 else (False,):
                report = evaluate(llm_asker(llm), heldout_examples(a.n, effort=effort, version=version, python=python))
                what = "python declared or asked for" if python else "no python"
                print(f"reasoning {effort}, {what}: {report.summary()}", flush=True)
                print(f"  by task: {report.by_task_summary()}", flush=True)
                for line in report.failures[: a.show_failures]:
                    print("  ", line)


if __name__ == "__main__":
    main()
