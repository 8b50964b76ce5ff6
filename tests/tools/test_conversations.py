"""Conversations' live tool states: found again by any response id of the conversation, bounded,
the least recently used closed (its python session stopped) past the bound."""

from __future__ import annotations

import asyncio
from typing import Any

from osserve.tools.conversations import ToolStates
from osserve.tools.registry import ConversationTools, ToolServers


class Closing(ConversationTools):
    def __init__(self) -> None:
        super().__init__(ToolServers(None, None, []))
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_states_are_found_by_any_response_of_the_conversation_and_bounded() -> None:
    states = ToolStates(max_conversations=2)
    a, b, c = Closing(), Closing(), Closing()

    async def go() -> None:
        await states.keep("r1", a)
        await states.keep("r2", a)  # a follow-up of r1 goes on with a's state
        await states.keep("r3", b)
        assert states.find("r1") is a and states.find("r2") is a and len(states) == 2
        await states.keep("r4", c)  # b is the least recently used now (find touched a): it goes
        assert b.closed == 1 and states.find("r3") is None and states.find("r2") is a and a.closed == 0
        await states.release(Closing())  # an unstored response's own state closes...
        await states.release(a)  # ...one a stored response holds stays
        assert a.closed == 0
        await states.close()
        assert a.closed == c.closed == 1 and len(states) == 0 and states.find("r1") is None

    run(go())


def test_an_unstored_new_state_is_closed() -> None:
    states, fresh = ToolStates(), Closing()
    run(states.release(fresh))
    assert fresh.closed == 1 and states.find(None) is None
