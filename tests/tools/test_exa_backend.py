"""The browser's Exa backend against a local fake of Exa's API (a real HTTP server on 127.0.0.1 that
answers `/search` and `/contents` the way Exa documents them). The real Exa service cannot be
reached from here: these tests show the requests are Exa-shaped, that only the API base is ever
contacted (an opened URL travels as data), and that errors, redirects and oversize answers come
back to the model as text."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from osserve.errors import ToolSetupError
from osserve.tools.browser.exa import ExaBackend
from osserve.tools.browser.tool import BrowserTool


class FakeExa(ThreadingHTTPServer):
    """Answers per `mode`; records every request (method, path, headers, JSON body)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeExaHandler)
        self.mode = "ok"
        self.requests: list[dict[str, Any]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # the client hangs up on the oversize answer on purpose

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeExaHandler(BaseHTTPRequestHandler):
    server: FakeExa

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.server.requests.append({"method": "GET", "path": self.path})
        self._send(200, b"a page that must never be fetched directly")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.requests.append({"method": "POST", "path": self.path, "key": self.headers["x-api-key"],
                                     "body": body})
        mode = self.server.mode
        if mode == "unauthorized":
            return self._send(401, b'{"error": "invalid API key"}')
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", f"{self.server.base}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if mode == "huge":
            return self._send(200, b'{"results": [' + b'{"url": "https://x.example/", "title": "x"},' * 200_000)
        if self.path == "/search":
            results = [{"title": f"Result {i} about {body['query']}", "url": f"https://site{i}.example/page",
                        "summary": f"Summary {i}.", "text": "full text"} for i in range(body["numResults"])]
            return self._send(200, json.dumps({"results": results}).encode())
        if self.path == "/contents":
            url = body["urls"][0]
            html = (f"<html><head><title>ignored</title><script>x()</script></head><body><h1>Page</h1>"
                    f"<p>Opened {url}. See <a href='/next'>the next page</a>.</p></body></html>")
            return self._send(200, json.dumps({"results": [{"url": url, "title": "A page", "text": html}]}).encode())
        return self._send(404, b"{}")

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture()
def fake_exa() -> Iterator[FakeExa]:
    server = FakeExa()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def browse(server: FakeExa, *calls: tuple[str, dict[str, Any]], **kwargs: Any) -> list[tuple[str, bool]]:
    async def go() -> list[tuple[str, bool]]:
        backend = ExaBackend("test-key", base_url=server.base, **kwargs)
        session = BrowserTool(backend).new_session()
        try:
            return [await session.call(name, json.dumps(args)) for name, args in calls]
        finally:
            await backend.aclose()

    return run(go())


def test_search_and_open_go_through_the_api_only(fake_exa: FakeExa) -> None:
    private = f"{fake_exa.base}/private"  # an address on the fake's own host, opened by URL
    (results, _), (opened, _), (direct, failed) = browse(
        fake_exa, ("search", {"query": "mxfp4", "topn": 3}), ("open", {"id": 1}), ("open", {"id": private}))
    assert "L4:   * 【0†Result 0 about mxfp4†site0.example】 Summary 0." in results
    assert opened.startswith("[1] A page (https://site1.example/page)")
    assert "Opened https://site1.example/page." in opened and "x()" not in opened
    assert "【0†the next page】" in opened  # a relative link, resolved on the page's own site
    assert not failed and f"Opened {private}." in direct
    assert all(r["method"] == "POST" for r in fake_exa.requests)  # the private page was never fetched
    search, first, second = fake_exa.requests
    assert search["path"] == "/search" and search["key"] == "test-key"
    assert search["body"]["query"] == "mxfp4" and search["body"]["numResults"] == 3
    assert first["path"] == second["path"] == "/contents"
    assert first["body"] == {"urls": ["https://site1.example/page"], "text": {"includeHtmlTags": True}}
    assert second["body"]["urls"] == [private]


def test_api_errors_come_back_as_text(fake_exa: FakeExa) -> None:
    fake_exa.mode = "unauthorized"
    ((text, failed),) = browse(fake_exa, ("search", {"query": "q"}))
    assert failed and text.startswith("Error during search for `q`: Exa error 401")


def test_redirects_are_not_followed(fake_exa: FakeExa) -> None:
    fake_exa.mode = "redirect"
    ((text, failed),) = browse(fake_exa, ("search", {"query": "q"}))
    assert failed and "Exa error 302" in text
    assert [r["path"] for r in fake_exa.requests] == ["/search"]


def test_oversize_answers_are_refused(fake_exa: FakeExa) -> None:
    fake_exa.mode = "huge"
    ((text, failed),) = browse(fake_exa, ("search", {"query": "q"}), max_response_bytes=1 << 20)
    assert failed and "over 1048576 bytes" in text


def test_a_key_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXA_API_KEY", raising=False)
    with pytest.raises(ToolSetupError, match="EXA_API_KEY"):
        ExaBackend()
