"""harmony's `browser` tool: `search`, `open`, `find`, with the display gpt-oss was trained on.

Each call shows one page through a viewport: `[cursor] title (url)`, a `**viewing lines [a - b] of
n**` bar, then numbered lines `L12: text`. Every page shown goes on the conversation's page stack;
its index is the cursor the model cites as `【cursor†L9-L11】`. Semantics follow gpt-oss's
reference `simple_browser`: `open` takes a link id of a page (or a URL), or no id to scroll; `find`
lists lowercase matches of a pattern in a page as a page of its own. Errors come back as text
for the model, never as exceptions. The viewport is sized in characters (about 4 a token)
instead of the reference's token count, so the tool needs no tokenizer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from openai_harmony import ToolNamespaceConfig

from osserve.tools.browser.backend import BackendError, BrowserBackend, search_results_page
from osserve.tools.browser.page import Extract, Page, strip_links, wrap_lines

CITATION = re.compile(r"【(\d+)†L(\d+)(?:-L(\d+))?】")
_NUMBER = {"type": "integer", "minimum": -1, "maximum": 1_000_000}
# The arguments of each function as a forced call's grammar takes them (structured/): harmony's own
# schemas (what the model is shown), with bounds, so that a forced call ends.
ARGUMENT_SCHEMAS: dict[str, dict[str, Any]] = {
    "search": {"type": "object", "additionalProperties": False, "required": ["query"], "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 256},
        "topn": {"type": "integer", "minimum": 1, "maximum": 20},
        "source": {"type": "string", "maxLength": 64}}},
    "open": {"type": "object", "additionalProperties": False, "properties": {
        "id": {"anyOf": [_NUMBER, {"type": "string", "maxLength": 2048}]}, "cursor": _NUMBER, "loc": _NUMBER,
        "num_lines": _NUMBER, "view_source": {"type": "boolean"}, "source": {"type": "string", "maxLength": 64}}},
    "find": {"type": "object", "additionalProperties": False, "required": ["pattern"], "properties": {
        "pattern": {"type": "string", "minLength": 1, "maxLength": 256}, "cursor": _NUMBER}},
}


class ToolUsageError(Exception):
    """A call the browser cannot carry out as asked; its text is shown to the model."""


@dataclass(frozen=True)
class Citation:
    """A `【cursor†Lx-Ly】` in the model's text, and the page it cites."""

    start: int
    end: int
    url: str
    title: str


def truncate(text: str, limit: int = 1024) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class BrowserTool:
    """The browser over one backend; `new_session()` gives a conversation its page stack."""

    name = "browser"

    def __init__(self, backend: BrowserBackend, *, view_chars: int = 4096, max_view_lines: int = 200,
                 max_search_results: int = 20, max_pages: int = 200) -> None:
        self.backend = backend
        self.view_chars = view_chars
        self.max_view_lines = max_view_lines
        self.max_search_results = max_search_results
        self.max_pages = max_pages

    def namespace_config(self) -> ToolNamespaceConfig:
        config = ToolNamespaceConfig.browser()
        lines = config.description.split("\n")
        config.description = "\n".join(
            [line for line in lines if not line.startswith("sources=")] + [f"sources={self.backend.source}"])
        return config

    def new_session(self) -> BrowserSession:
        return BrowserSession(self)

    async def aclose(self) -> None:
        await self.backend.aclose()


@dataclass
class _Shown:
    page: Page
    cite_url: str  # what a citation of this cursor points to ("" for search results)


class BrowserSession:
    def __init__(self, tool: BrowserTool) -> None:
        self.tool = tool
        self.stack: list[_Shown] = []
        self._cache: dict[str, Page] = {}

    async def call(self, function: str, arguments_text: str) -> tuple[str, bool]:
        """Runs `browser.<function>` with the model's JSON arguments: (what the model is shown,
        whether it is an error)."""
        try:
            args = json.loads(arguments_text) if arguments_text.strip() else {}
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return json.dumps({"error": "Invalid function arguments"}), True
        if function not in ("search", "open", "find"):
            return json.dumps({"error": f"Unknown function: {function}"}), True
        try:
            if function == "search":
                return await self.search(args), False
            if function == "open":
                return await self.open(args), False
            return self.find(args), False
        except (ToolUsageError, BackendError) as exc:
            return str(exc), True

    async def search(self, args: dict[str, Any]) -> str:
        query = text_argument(args, "query")
        topn = max(1, min(int_argument(args, "topn", 10), self.tool.max_search_results))
        try:
            hits = await self.tool.backend.search(query, topn)
        except Exception as exc:
            raise BackendError(f"Error during search for `{truncate(query)}`: {truncate(str(exc))}") from exc
        return self._push_and_show(search_results_page(query, hits), "", loc=0)

    async def open(self, args: dict[str, Any]) -> str:
        link = args.get("id", -1)
        if isinstance(link, str) and link.strip().lstrip("-").isdigit():
            link = int(link)
        cursor = int_argument(args, "cursor", -1)
        loc = int_argument(args, "loc", -1)
        num_lines = int_argument(args, "num_lines", -1)
        snippet: Extract | None = None
        if isinstance(link, str):  # a URL: the backend decides whether it can open it
            page = await self._fetch(link, refresh=True)
        else:
            link = int_argument({"id": link}, "id", -1)
            current = self._entry(cursor).page
            if link >= 0:
                url = current.urls.get(str(link))
                if url is None:
                    raise ToolUsageError(f"Invalid link id `{link}`.")
                snippet = (current.snippets or {}).get(str(link))
                page = await self._fetch(url, refresh=False)
            else:  # scroll the page itself
                page = current
        if loc < 0:
            loc = snippet.line_idx if snippet is not None and snippet.line_idx is not None else 0
            loc = loc - 4 if loc > 4 else loc
        return self._push_and_show(page, page.url, loc, num_lines)

    def find(self, args: dict[str, Any]) -> str:
        pattern = text_argument(args, "pattern").lower()
        entry = self._entry(int_argument(args, "cursor", -1))
        page = entry.page
        if page.snippets is not None:
            raise ToolUsageError("Cannot run `find` on search results page or find results page")
        lines = strip_links("\n".join(wrap_lines(page.text))).split("\n")
        chunks: list[str] = []
        snippets: dict[str, Extract] = {}
        line_idx = 0
        while line_idx < len(lines) and len(chunks) < 50:
            if pattern not in lines[line_idx].lower():
                line_idx += 1
                continue
            snippet = "\n".join(lines[line_idx:line_idx + 4])
            snippets[str(len(chunks))] = Extract(page.url, snippet, f"#{len(chunks)}", line_idx)
            chunks.append(f"# 【{len(chunks)}†match at L{line_idx}】\n{snippet}")
            line_idx += 4
        text = "\n\n".join(chunks) if chunks else f"No `find` results for pattern: `{pattern}`"
        result = Page(url=f"{page.url}/find?pattern={quote(pattern)}",
                      title=f"Find results for text: `{pattern}` in `{page.title}`", text=text,
                      urls={key: page.url for key in snippets}, snippets=snippets)
        return self._push_and_show(result, entry.cite_url, loc=0)

    def action(self, function: str, arguments_text: str) -> dict[str, Any]:
        """What a call is about to do, as the Responses API's `web_search_call.action` tells it
        (search: the query; open_page: the URL the link or cursor names; find_in_page: the page's
        URL and the pattern), read from the page stack before the call runs. Never raises."""
        try:
            args = json.loads(arguments_text) if arguments_text.strip() else {}
        except json.JSONDecodeError:
            args = {}
        args = args if isinstance(args, dict) else {}
        if function == "search":
            query = args.get("query") if isinstance(args.get("query"), str) else ""
            return {"type": "search", "query": query, "queries": [query] if query else []}
        try:
            entry = self._entry(int_argument(args, "cursor", -1)) if self.stack else None
        except ToolUsageError:
            entry = None
        if function == "find":
            pattern = args.get("pattern")
            return {"type": "find_in_page", "url": entry.cite_url if entry else "",
                    "pattern": pattern if isinstance(pattern, str) else ""}
        link = args.get("id", -1)
        if isinstance(link, str) and not link.strip().lstrip("-").isdigit():
            return {"type": "open_page", "url": link}
        if entry is None:
            return {"type": "open_page", "url": None}
        try:
            number = int(link)
        except (TypeError, ValueError):
            number = -1
        url = entry.page.urls.get(str(number)) if number >= 0 else entry.page.url
        return {"type": "open_page", "url": url or None}

    def citations(self, text: str) -> list[Citation]:
        """The `【cursor†Lx(-Ly)】` citations in `text` whose cursor names a page with a URL."""
        found = []
        for match in CITATION.finditer(text):
            cursor = int(match.group(1))
            if cursor < len(self.stack) and (url := self.stack[cursor].cite_url):
                found.append(Citation(match.start(), match.end(), url, self.stack[cursor].page.title))
        return found

    async def _fetch(self, url: str, refresh: bool) -> Page:
        if not refresh and url in self._cache:
            return self._cache[url]
        try:
            page = await self.tool.backend.fetch(url)
        except Exception as exc:
            raise BackendError(f"Error fetching URL `{truncate(url)}`: {truncate(str(exc))}") from exc
        self._cache[page.url] = page
        return page

    def _entry(self, cursor: int) -> _Shown:
        if not self.stack:
            raise ToolUsageError("No pages to access!")
        if cursor == -1:
            return self.stack[-1]
        if not 0 <= cursor < len(self.stack):
            raise ToolUsageError(f"Cursor `{cursor}` is out of range. "
                                 f"Available cursor indices: [0 - {len(self.stack) - 1}].")
        return self.stack[cursor]

    def _push_and_show(self, page: Page, cite_url: str, loc: int, num_lines: int = -1) -> str:
        if len(self.stack) >= self.tool.max_pages:
            raise ToolUsageError(f"Too many pages opened in this conversation (at most {self.tool.max_pages}).")
        lines = page.lines()
        if loc >= len(lines):
            raise ToolUsageError(f"Invalid location parameter: `{loc}`. "
                                 f"Cannot exceed page maximum of {len(lines) - 1}.")
        self.stack.append(_Shown(page, cite_url))
        end = self._view_end(lines, loc, num_lines)
        body = "\n".join(f"L{i}: {line}" for i, line in enumerate(lines[loc:end], start=loc))
        header = page.title + (f" ({truncate(unquote(page.url))})" if page.url else "")
        bar = f"viewing lines [{loc} - {end - 1}] of {len(lines) - 1}"
        return f"[{len(self.stack) - 1}] {header}\n**{bar}**\n\n{body}"

    def _view_end(self, lines: list[str], loc: int, num_lines: int) -> int:
        """Where the viewport ends: `num_lines` when asked (bounded), else as many lines as fit
        in the character budget."""
        most = min(len(lines), loc + self.tool.max_view_lines)
        if num_lines > 0:
            return min(most, loc + num_lines)
        end, used = loc, 0
        while end < most and (end == loc or used + len(lines[end]) + 8 <= self.tool.view_chars):
            used += len(lines[end]) + 8
            end += 1
        return end


def text_argument(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolUsageError(f"`{name}` is required and should be a non-empty string.")
    return value[:2000]


def int_argument(args: dict[str, Any], name: str, default: int) -> int:
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolUsageError(f"`{name}` should be an integer, not `{type(value).__name__}`")
    return max(-1, min(value, 10**9))
