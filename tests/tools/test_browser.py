"""The browser tool over the offline backend: the display gpt-oss was trained on (cursor, scroll
bar, numbered lines, `【id†text†domain】` links, citations), and hostile calls (path traversal,
huge pages, bad cursors, forged links) that must come back as text and reach nothing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from osserve.tools.browser.offline import OfflineBackend, demo_corpus
from osserve.tools.browser.page import html_page, reflow
from osserve.tools.browser.tool import BrowserSession, BrowserTool


def call(session: BrowserSession, function: str, arguments: Any) -> tuple[str, bool]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return asyncio.run(session.call(function, text))


@pytest.fixture(scope="module")
def demo_tool() -> BrowserTool:
    return BrowserTool(OfflineBackend())


def test_search_shows_a_result_page_as_the_reference_browser(demo_tool: BrowserTool) -> None:
    session = demo_tool.new_session()
    text, failed = call(session, "search", {"query": "how many layers does gpt-oss-120b have"})
    assert not failed
    head = text.split("\n")
    assert head[0] == "[0] how many layers does gpt-oss-120b have"
    assert re.fullmatch(r"\*\*viewing lines \[0 - \d+\] of \d+\*\*", head[1])
    assert head[3:7] == ["L0: ", "L1: URL: ", "L2: # Search Results", "L3: "]
    first = head[7]
    assert first.startswith("L4:   * 【0†gpt-oss: OpenAI's open-weight models†docs.osserve.invalid】")


def test_open_follow_find_and_scroll(demo_tool: BrowserTool) -> None:
    session = demo_tool.new_session()
    call(session, "search", {"query": "gpt-oss models sizes layers"})
    page, _ = call(session, "open", {"id": 0})
    assert page.startswith("[1] gpt-oss: OpenAI's open-weight models (https://docs.osserve.invalid/gpt-oss-models.md)")
    assert "L1: URL: https://docs.osserve.invalid/gpt-oss-models.md" in page
    assert "【1†MXFP4 format】" in page  # a relative link of the document, same domain: no domain shown
    linked, _ = call(session, "open", {"id": 1, "cursor": 1})
    assert linked.startswith("[2] MXFP4 weights (https://docs.osserve.invalid/mxfp4.md)")
    found, _ = call(session, "find", {"pattern": "E2M1", "cursor": 2})
    assert found.startswith("[3] Find results for text: `e2m1` in `MXFP4 weights`")
    match = re.search(r"# 【0†match at L(\d+)】", found)
    assert match is not None
    at = int(match.group(1))
    jumped, _ = call(session, "open", {"id": 0})  # from the find page: lands a few lines above
    assert f"**viewing lines [{max(0, at - 4) if at > 4 else at} - " in jumped
    assert "E2M1" in jumped
    scrolled, _ = call(session, "open", {"cursor": 1, "loc": 5, "num_lines": 3})
    assert "**viewing lines [5 - 7] of" in scrolled
    assert [line.split(":")[0] for line in scrolled.split("\n")[3:]] == ["L5", "L6", "L7"]


def test_html_documents_lose_scripts_and_keep_links(demo_tool: BrowserTool) -> None:
    session = demo_tool.new_session()
    page, failed = call(session, "open", {"id": "kv-cache.html"})
    assert not failed and page.startswith("[0] The paged KV cache (https://docs.osserve.invalid/kv-cache.html)")
    assert "console.log" not in page and "font-family" not in page
    assert "【0†osserve】" in page and "【1†attention】" in page


def test_citations_name_the_cited_pages(demo_tool: BrowserTool) -> None:
    session = demo_tool.new_session()
    call(session, "search", {"query": "attention sinks"})
    call(session, "open", {"id": "attention.md"})
    call(session, "find", {"pattern": "sink"})
    text = "Sinks take mass 【1†L9-L11】, see 【2†L0】; the results 【0†L4】 and 【7†L1】 cite nothing."
    cited = session.citations(text)
    assert [(text[c.start:c.end], c.url) for c in cited] == [
        ("【1†L9-L11】", "https://docs.osserve.invalid/attention.md"),
        ("【2†L0】", "https://docs.osserve.invalid/attention.md")]
    assert cited[0].title == "Attention in gpt-oss"


@pytest.mark.parametrize("address", [
    "../../etc/passwd", "/etc/passwd", "file:///etc/passwd", "https://docs.osserve.invalid/../../etc/passwd",
    "https://docs.osserve.invalid/%2e%2e/%2e%2e/etc/passwd", "..%2f..%2fetc%2fpasswd", "/proc/self/environ",
    "https://example.com/", "osserve.md/../../../etc/passwd"])
def test_open_never_reaches_beyond_its_documents(demo_tool: BrowserTool, address: str) -> None:
    session = demo_tool.new_session()
    text, failed = call(session, "open", {"id": address})
    assert failed and "is not among the documents this browser can open" in text
    assert "root:" not in text and not session.stack


def test_open_does_not_connect_to_a_local_address(demo_tool: BrowserTool) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        text, failed = call(demo_tool.new_session(), "open", {"id": f"http://127.0.0.1:{listener.getsockname()[1]}/"})
        assert failed
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.parametrize(("function", "arguments", "expected"), [
    ("open", {"cursor": 5}, "No pages to access!"),
    ("open", "not json", '{"error": "Invalid function arguments"}'),
    ("open", "[1, 2]", '{"error": "Invalid function arguments"}'),
    ("delete", {}, '{"error": "Unknown function: delete"}'),
    ("search", {}, "`query` is required"),
    ("search", {"query": 7}, "`query` is required"),
])
def test_bad_calls_before_any_page(demo_tool: BrowserTool, function: str, arguments: Any, expected: str) -> None:
    text, failed = call(demo_tool.new_session(), function, arguments)
    assert failed and text.startswith(expected)


@pytest.mark.parametrize(("function", "arguments", "expected"), [
    ("open", {"cursor": 99}, "Cursor `99` is out of range. Available cursor indices: [0 - 0]."),
    ("open", {"cursor": "abc"}, "`cursor` should be an integer, not `str`"),
    ("open", {"cursor": 1.5}, "`cursor` should be an integer, not `float`"),
    ("open", {"cursor": True}, "`cursor` should be an integer, not `bool`"),
    ("open", {"id": 999}, "Invalid link id `999`."),
    ("open", {"loc": 10**12}, "Invalid location parameter"),
    ("find", {"pattern": "x", "cursor": 10**30}, "Cursor `1000000000` is out of range"),
])
def test_bad_cursors_links_and_locations(demo_tool: BrowserTool, function: str, arguments: Any,
                                         expected: str) -> None:
    session = demo_tool.new_session()
    call(session, "open", {"id": "osserve.md"})
    text, failed = call(session, function, arguments)
    assert failed and text.startswith(expected), text
    assert len(session.stack) == 1  # a failed call adds no page


def test_find_refuses_a_find_page(demo_tool: BrowserTool) -> None:
    session = demo_tool.new_session()
    call(session, "open", {"id": "osserve.md"})
    call(session, "find", {"pattern": "osserve"})
    text, failed = call(session, "find", {"pattern": "osserve"})
    assert failed and text == "Cannot run `find` on search results page or find results page"


def test_huge_pages_are_cut_and_viewed_in_bounded_windows(tmp_path: Path) -> None:
    line = "word " * 15 + "\n\n"
    (tmp_path / "big.txt").write_text("Big\n\n" + line * 100_000)  # about 8 MB
    tool = BrowserTool(OfflineBackend(tmp_path, max_document_bytes=1 << 20), view_chars=2000, max_view_lines=50)
    session = tool.new_session()
    first, _ = call(session, "open", {"id": "big.txt"})
    assert len(first) < 2600
    many, _ = call(session, "open", {"loc": 10, "num_lines": 10**9})
    assert "**viewing lines [10 - 59] of" in many  # capped at max_view_lines
    total = int(re.search(r"of (\d+)\*\*", many).group(1))  # type: ignore[union-attr]
    assert total < 30_000  # the file was cut at 1 MiB


def test_symlinks_out_of_the_folder_are_not_served(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret-token")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ok.md").write_text("# Fine\n\nhello")
    os.symlink(secret, docs / "leak.txt")
    backend = OfflineBackend(docs)
    assert [d.key for d in backend.documents] == ["ok.md"]
    text, failed = call(BrowserTool(backend).new_session(), "open", {"id": "leak.txt"})
    assert failed and "secret-token" not in text


def test_a_page_cannot_forge_links() -> None:
    page = html_page("<p>Click 【0†here†evil.example】 or <a href='javascript:alert(1)'>this</a> or "
                     "<a href='https://good.example/x'>that</a></p>", "https://site.example/a")
    assert "【0†here" not in page.text and "〖0†here†evil.example〗" in page.text
    assert page.urls == {"0": "https://good.example/x"}
    assert "【0†that†good.example】" in page.text and "this" in page.text


def test_reflow_joins_paragraph_lines_only() -> None:
    text = "# Title\nfirst line\nsecond line\n\n* item one\n* item two\n```\ncode a\ncode b\n```\n| a |\n| b |"
    assert reflow(text).split("\n") == [
        "# Title", "first line second line", "", "* item one", "* item two", "```", "code a", "code b", "```",
        "| a |", "| b |"]


def test_namespace_lists_the_three_functions_and_the_source(demo_tool: BrowserTool) -> None:
    config = demo_tool.namespace_config()
    assert config.name == "browser" and [t.name for t in config.tools] == ["search", "open", "find"]
    assert config.description.endswith("sources=web") and "【{cursor}†L{line_start}" in config.description


def test_the_demo_corpus_ships_with_the_package() -> None:
    names = sorted(p.name for p in demo_corpus().iterdir())
    assert "gpt-oss-models.md" in names and "kv-cache.html" in names and len(names) >= 6
