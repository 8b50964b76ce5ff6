"""The Responses API's memory: stored responses by id, bounded, least recently used evicted.

Kept in SQLite: in memory for one HTTP process, in a file when several serve one engine
(server/api_servers.py), so a `previous_response_id` is found whichever process the follow-up
request reaches."""

from __future__ import annotations

import pickle
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from osserve.harmony.render import ChatMessage


@dataclass
class StoredResponse:
    body: dict[str, Any]  # the response object as returned to the client
    conversation: list[ChatMessage] = field(default_factory=list)  # input + output, for chaining
    instructions: str | None = None
    mcp_listed: list[str] = field(default_factory=list)  # MCP servers whose tools the conversation has listed


class ResponseStore:
    def __init__(self, max_entries: int = 1024, path: str = ":memory:") -> None:
        """path: a database file that other server processes open too (written only by them)."""
        self.max_entries = max_entries
        # Autocommit, and any thread: the event loop's thread uses it, one call at a time.
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")  # readers do not wait for a writer
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, used INTEGER, item BLOB)")

    @staticmethod
    def create(path: str) -> None:
        """Make a shared database file before the processes that share it open it: switching a file
        to WAL takes a lock the busy timeout does not wait for, so server processes switching it at
        once could fail with "database is locked" (a test's two servers did). In WAL already, their
        own switch changes nothing."""
        ResponseStore(path=path)._db.close()

    def put(self, response_id: str, item: StoredResponse) -> None:
        self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, (SELECT COALESCE(MAX(used), 0) + 1 "
                         "FROM responses), ?)", (response_id, pickle.dumps(item)))
        self._db.execute("DELETE FROM responses WHERE id NOT IN "
                         "(SELECT id FROM responses ORDER BY used DESC LIMIT ?)", (self.max_entries,))

    def get(self, response_id: str) -> StoredResponse | None:
        row = self._db.execute("SELECT item FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return None
        self._db.execute("UPDATE responses SET used = (SELECT MAX(used) + 1 FROM responses) WHERE id = ?",
                         (response_id,))
        item: StoredResponse = pickle.loads(row[0])
        return item

    def __len__(self) -> int:
        count: int = self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        return count
