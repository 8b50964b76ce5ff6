"""The browser's Exa backend: search and page contents through Exa's API (api.exa.ai), as
gpt-oss's reference browser does (`/search` with summaries, `/contents` with HTML tags kept so that
a page's links survive).

It talks to its configured API base only: a URL the model opens is sent to Exa as data, never
fetched; redirects are not followed; an answer is read up to `max_response_bytes`. Plain httpx
(already a dependency) rather than the exa-py SDK: two POSTs need no SDK, and a size cap and no
redirects are easier to hold to on a client we configure ourselves.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from osserve import __version__
from osserve.errors import ToolSetupError
from osserve.tools.browser.backend import BackendError, SearchHit
from osserve.tools.browser.page import Page, html_page

DEFAULT_BASE_URL = "https://api.exa.ai"


class ExaBackend:
    def __init__(self, api_key: str | None = None, *, base_url: str = DEFAULT_BASE_URL, source: str = "web",
                 timeout: float = 20.0, max_response_bytes: int = 8 << 20,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        key = api_key or os.environ.get("EXA_API_KEY")
        if not key:
            raise ToolSetupError("the Exa browser backend needs an API key (EXA_API_KEY)")
        self.source = source
        self.base_url = base_url.rstrip("/")
        self.max_response_bytes = max_response_bytes
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, follow_redirects=False, transport=transport,
            headers={"x-api-key": key, "user-agent": f"osserve/{__version__}"})

    async def _post(self, endpoint: str, payload: dict[str, Any]) -> Any:
        async with self._client.stream("POST", endpoint, json=payload) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_response_bytes:
                    raise BackendError(f"Exa's answer is over {self.max_response_bytes} bytes")
        if response.status_code != 200:
            raise BackendError(f"Exa error {response.status_code}: {body[:500].decode(errors='replace')}")
        try:
            return json.loads(bytes(body))
        except ValueError as exc:
            raise BackendError("Exa's answer is not JSON") from exc

    async def search(self, query: str, topn: int) -> list[SearchHit]:
        data = await self._post("/search", {"query": query, "numResults": topn,
                                            "contents": {"text": {"maxCharacters": 1000}, "summary": True}})
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise BackendError("Exa's search answer has no results list")
        hits = []
        for item in results:
            if not isinstance(item, dict) or not isinstance(item.get("url"), str):
                continue
            summary = item.get("summary") or (item.get("text") or "")[:300]
            hits.append(SearchHit(str(item.get("title") or ""), item["url"], str(summary)))
        return hits

    async def fetch(self, url: str) -> Page:
        data = await self._post("/contents", {"urls": [url], "text": {"includeHtmlTags": True}})
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list) or not results or not isinstance(results[0], dict):
            raise BackendError(f"No contents returned for {url}")
        first = results[0]
        return html_page(str(first.get("text") or ""), url, str(first.get("title") or "") or None)

    async def aclose(self) -> None:
        await self._client.aclose()
