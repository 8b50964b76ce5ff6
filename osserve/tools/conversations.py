"""Each conversation's live tool state (the browser's page stack, the python session), kept with
its stored responses so that `previous_response_id` goes on where the conversation left off.

A conversation's state is one `ConversationTools`, known under the id of every stored response of
the conversation (a follow-up adds its own id; two follow-ups of one response share it, as two
cells of one notebook would). At most `max_conversations` are kept, the least recently used closed
past that (its python session stopped). The state lives in this HTTP process: with several
(`--api-server-count`), a follow-up that reaches another process starts with fresh tools, and
its model reads the python tool's own words for a restarted session.
"""

from __future__ import annotations

from collections import OrderedDict

from osserve.tools.registry import ConversationTools


class ToolStates:
    """Conversations' tool states by response id (see the module docstring)."""

    def __init__(self, max_conversations: int = 256) -> None:
        self.max_conversations = max_conversations
        self._by_response: dict[str, ConversationTools] = {}
        self._recent: OrderedDict[int, ConversationTools] = OrderedDict()  # by id(), least recent first

    def __len__(self) -> int:
        return len(self._recent)

    def find(self, previous_response_id: str | None) -> ConversationTools | None:
        """The state a follow-up of `previous_response_id` goes on with, if this process keeps one."""
        found = self._by_response.get(previous_response_id or "")
        if found is None or id(found) not in self._recent:
            return None
        self._recent.move_to_end(id(found))
        return found

    async def keep(self, response_id: str, tools: ConversationTools) -> None:
        """Keeps `tools` under a stored response's id; closes the least recently used past the bound."""
        self._by_response[response_id] = tools
        self._recent[id(tools)] = tools
        self._recent.move_to_end(id(tools))
        while len(self._recent) > self.max_conversations:
            _, oldest = self._recent.popitem(last=False)
            await self._forget(oldest)

    async def release(self, tools: ConversationTools) -> None:
        """A response that is not stored: its state goes unless a stored response holds it."""
        if id(tools) not in self._recent:
            await tools.close()

    async def close(self) -> None:
        while self._recent:
            _, tools = self._recent.popitem()
            await self._forget(tools)

    async def _forget(self, tools: ConversationTools) -> None:
        for response_id in [r for r, t in self._by_response.items() if t is tools]:
            del self._by_response[response_id]
        await tools.close()
