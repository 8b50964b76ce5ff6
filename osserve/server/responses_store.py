"""The Responses API's memory: stored responses by id, bounded, least recently used evicted."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from osserve.harmony.render import ChatMessage


@dataclass
class StoredResponse:
    body: dict[str, Any]  # the response object as returned to the client
    conversation: list[ChatMessage] = field(default_factory=list)  # input + output, for chaining
    instructions: str | None = None


class ResponseStore:
    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, item: StoredResponse) -> None:
        self._items[response_id] = item
        self._items.move_to_end(response_id)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item

    def __len__(self) -> int:
        return len(self._items)
