"""A response's output items as they are made, and, when streamed, their events in OpenAI's order.

One `OutputStream` per response, fed by the loop (loop.py) with what the model writes and what the
tools do; streamed or not, the items are built the same way (non-streamed responses just keep no
events). Each item is added when it starts and replaced when done:

    reasoning         output_item.added, content_part.added, reasoning_text.delta*, .done, ... item.done
    message           output_item.added, content_part.added, output_text.delta*,
                      output_text.annotation.added* (a citation of a browser page), .done, ... item.done
    function_call     output_item.added, function_call_arguments.delta*, .done, output_item.done
    code_interpreter_call  output_item.added, code_interpreter_call.in_progress, _code.delta*, _code.done,
                      .interpreting, (the code runs) .completed, output_item.done (with its logs)
    mcp_call          output_item.added, mcp_call.in_progress, mcp_call_arguments.delta*, .done,
                      (the tool runs) mcp_call.completed | mcp_call.failed, output_item.done
    web_search_call   (once the call is written) output_item.added, web_search_call.in_progress,
                      .searching, (the browser runs) .completed, output_item.done
    mcp_list_tools    output_item.added, mcp_list_tools.in_progress, .completed, output_item.done
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osserve.server.generation import new_id, sse

Citations = Callable[[str], list[dict[str, Any]]]  # a message's text -> its url_citation annotations


def output_text_part(text: str, annotations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    # `logprobs` is required by OpenAI's schema; osserve does not compute them for Responses yet.
    return {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": []}


@dataclass
class OpenItem:
    """The item whose text is streaming: what the model writes into it so far."""

    kind: str  # reasoning | message | function_call | code_interpreter_call | mcp_call | hidden
    index: int  # its output_index (-1: not shown, a call the loop shows once it is written)
    item_id: str
    text: str = ""
    fields: dict[str, Any] = field(default_factory=dict)


class OutputStream:
    def __init__(self, streaming: bool, citations: Citations | None = None) -> None:
        self.streaming = streaming
        self.citations = citations
        self.items: list[dict[str, Any]] = []
        self.open: OpenItem | None = None
        self._events: list[str] = []
        self._seq = 0

    # ------------------------------------------------------------------ events
    def event(self, kind: str, **data: Any) -> None:
        if self.streaming:
            self._events.append(sse({"type": kind, "sequence_number": self._seq, **data}, event=kind))
        self._seq += 1

    def drain(self) -> list[str]:
        """The events made since the last call (SSE text), to be written in order."""
        out, self._events = self._events, []
        return out

    def add(self, item: dict[str, Any]) -> int:
        """A new item, in progress: its output_index."""
        self.items.append(item)
        self.event("response.output_item.added", output_index=len(self.items) - 1, item=copy.deepcopy(item))
        return len(self.items) - 1

    def done(self, index: int, item: dict[str, Any]) -> None:
        self.items[index] = item
        self.event("response.output_item.done", output_index=index, item=copy.deepcopy(item))

    # ------------------------------------------------------------------ what the model writes
    def text(self, kind: str, text: str) -> None:
        """Reasoning or answer text: into the open item of that kind, or a new one."""
        if self.open is None or self.open.kind != kind:
            self.close()
            item_id = new_id("rs_" if kind == "reasoning" else "msg_")
            if kind == "reasoning":
                item = {"type": "reasoning", "id": item_id, "summary": [], "content": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
                part = output_text_part("")
            index = self.add(item)
            self.event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part)
            self.open = OpenItem(kind, index, item_id)
        self.open.text += text
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        self.event(delta, item_id=self.open.item_id, output_index=self.open.index, content_index=0, delta=text, **extra)

    def start_call(self, kind: str, call_id: str, **fields: Any) -> None:
        """A call the model begins: a function_call, code_interpreter_call or mcp_call item, or a
        hidden one (a browser call, shown once written; a call of a tool not declared)."""
        self.close()
        if kind == "function_call":
            item_id = f"fc_{call_id}"
            item: dict[str, Any] | None = {"type": "function_call", "id": item_id, "call_id": call_id,
                                           "name": fields["name"], "arguments": "", "status": "in_progress"}
        elif kind == "code_interpreter_call":
            item_id = call_id
            item = {"type": "code_interpreter_call", "id": item_id, "status": "in_progress",
                    "container_id": fields["container_id"], "code": "", "outputs": None}
        elif kind == "mcp_call":
            item_id = call_id
            item = {"type": "mcp_call", "id": item_id, "server_label": fields["server_label"],
                    "name": fields["name"], "arguments": "", "status": "in_progress"}
        else:
            item_id, item = call_id, None
        index = self.add(item) if item is not None else -1
        if kind == "code_interpreter_call":
            self.event("response.code_interpreter_call.in_progress", output_index=index, item_id=item_id)
        elif kind == "mcp_call":
            self.event("response.mcp_call.in_progress", output_index=index, item_id=item_id)
        self.open = OpenItem(kind, index, item_id, fields={"call_id": call_id, **fields})

    def call_text(self, text: str) -> None:
        it = self.open
        if it is None:
            return
        it.text += text
        if it.kind == "function_call":
            self.event("response.function_call_arguments.delta", item_id=it.item_id, output_index=it.index, delta=text)
        elif it.kind == "code_interpreter_call":
            self.event("response.code_interpreter_call_code.delta", item_id=it.item_id, output_index=it.index,
                       delta=text)
        elif it.kind == "mcp_call":
            self.event("response.mcp_call_arguments.delta", item_id=it.item_id, output_index=it.index, delta=text)

    def written_call(self) -> OpenItem | None:
        """The call just written (the model stopped to have it run): its text is done; the loop runs
        it and finishes its item. None where the open item is not a call."""
        it = self.open
        if it is None or it.kind in ("reasoning", "message"):
            return None
        self.open = None
        if it.kind == "code_interpreter_call":
            self.event("response.code_interpreter_call_code.done", item_id=it.item_id, output_index=it.index,
                       code=it.text)
        elif it.kind == "mcp_call":
            self.event("response.mcp_call_arguments.done", item_id=it.item_id, output_index=it.index,
                       arguments=it.text)
        elif it.kind == "function_call":
            self._finish_function_call(it, "completed")
        return it

    def close(self, status: str = "completed") -> None:
        """Ends the open item (`incomplete` where the output was cut)."""
        it, self.open = self.open, None
        if it is None:
            return
        if it.kind == "reasoning":
            self.event("response.reasoning_text.done", item_id=it.item_id, output_index=it.index, content_index=0,
                       text=it.text)
            part = {"type": "reasoning_text", "text": it.text}
            self.event("response.content_part.done", item_id=it.item_id, output_index=it.index, content_index=0,
                       part=part)
            self.done(it.index, {"type": "reasoning", "id": it.item_id, "summary": [], "content": [part],
                                 "status": status})
        elif it.kind == "message":
            annotations = self.citations(it.text) if self.citations is not None else []
            for i, annotation in enumerate(annotations):
                self.event("response.output_text.annotation.added", item_id=it.item_id, output_index=it.index,
                           content_index=0, annotation_index=i, annotation=annotation)
            self.event("response.output_text.done", item_id=it.item_id, output_index=it.index, content_index=0,
                       text=it.text, logprobs=[])
            part = output_text_part(it.text, annotations)
            self.event("response.content_part.done", item_id=it.item_id, output_index=it.index, content_index=0,
                       part=part)
            self.done(it.index, {"type": "message", "id": it.item_id, "role": "assistant", "status": status,
                                 "content": [part]})
        elif it.kind == "function_call":
            self._finish_function_call(it, status)
        elif it.kind in ("code_interpreter_call", "mcp_call"):  # cut before it was written whole: never run
            self.open = it
            self.written_call()
            item = copy.deepcopy(self.items[it.index])
            item.update({"status": "incomplete"}, **({"code": it.text} if it.kind == "code_interpreter_call"
                                                     else {"arguments": it.text}))
            self.done(it.index, item)

    def _finish_function_call(self, it: OpenItem, status: str) -> None:
        self.event("response.function_call_arguments.done", item_id=it.item_id, output_index=it.index,
                   name=it.fields["name"], arguments=it.text)
        self.done(it.index, {"type": "function_call", "id": it.item_id, "call_id": it.fields["call_id"],
                             "name": it.fields["name"], "arguments": it.text, "status": status})
