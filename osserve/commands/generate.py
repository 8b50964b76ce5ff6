"""`osserve generate`: one harmony conversation, decoded, its reasoning and answer printed apart."""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.harmony.render import ChatMessage, render_chat
from osserve.harmony.stream import parse_completion


def run_generate(args: argparse.Namespace) -> int:
    console = Console()
    engine = build_engine(EngineArgs.from_namespace(args))
    prompt = render_chat(
        [ChatMessage(role="user", content=args.prompt)], reasoning_effort=args.reasoning_effort
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    engine.add_request("generate-0", prompt.token_ids, params)
    tokens: list[int] = []
    start = time.perf_counter()
    finish = None
    while engine.has_unfinished():
        for d in engine.step():
            tokens.extend(d.new_token_ids)
            finish = d.finish_reason if d.finished else finish
    elapsed = time.perf_counter() - start
    parsed = parse_completion(tokens)
    console.rule("reasoning")
    console.print(parsed.reasoning or "(none)", markup=False)
    console.rule("final")
    console.print(parsed.content or "(none)", markup=False)
    for call in parsed.tool_calls:
        console.print(f"tool call: {call.name}({call.arguments})", markup=False)
    console.rule()
    console.print(
        f"{len(prompt.token_ids)} prompt tokens, {len(tokens)} generated in {elapsed:.2f}s "
        f"({len(tokens) / max(elapsed, 1e-9):.1f} tok/s), finish_reason={finish}"
    )
    return 0
