"""What the browser tool asks of a search backend, and the search-result page it shows the model.

Two backends implement it: `OfflineBackend` (a folder of documents, bm25 search, no network) and
`ExaBackend` (Exa's search API). A backend turns a URL into a page only from what it is allowed to
reach: the offline one from its own documents, Exa's by asking Exa; neither fetches the address.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from osserve.tools.browser.page import Page, clean_text, domain_of


class BackendError(Exception):
    """A search or an open that failed; its text is shown to the model."""


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    summary: str


class BrowserBackend(Protocol):
    source: str  # shown to the model as the namespace's `sources=`

    async def search(self, query: str, topn: int) -> list[SearchHit]: ...

    async def fetch(self, url: str) -> Page: ...

    async def aclose(self) -> None: ...


def search_results_page(query: str, hits: list[SearchHit]) -> Page:
    """The page a search shows, laid out as gpt-oss's reference browser lays it out (a list of
    links with their summaries under `# Search Results`; the page itself has no URL)."""
    urls: dict[str, str] = {}
    lines = ["", "URL: ", "# Search Results", ""]
    for hit in hits:
        link_id = str(len(urls))
        urls[link_id] = hit.url
        title = " ".join(clean_text(hit.title).replace("†", "‡").split()) or domain_of(hit.url)
        summary = " ".join(clean_text(hit.summary).split())
        lines.append(f"  * 【{link_id}†{title}†{domain_of(hit.url)}】 {summary}".rstrip())
    return Page(url="", title=clean_text(query), text="\n".join(lines), urls=urls)
