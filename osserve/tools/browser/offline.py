"""The browser's offline backend: search and open over a folder of documents, no network.

Documents are markdown (.md), plain text (.txt) or HTML (.html, .htm) files under one folder; each
gets a URL under `base_url` (by default under the reserved `.invalid` domain, which never resolves)
from its path in the folder. Search is BM25 through `bm25s` (a maintained library on numpy alone,
sparse-matrix scoring, no index files on disk). `open` looks a URL up among the loaded documents:
a URL is a key, never a path, so `../` or `file:` addresses name nothing. Files are read once at
start, symlinks are not followed, and each is cut at `max_document_bytes`.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import quote, unquote, urldefrag

from osserve.tools.browser.backend import BackendError, SearchHit
from osserve.tools.browser.page import Page, html_to_markdown, markdown_page, strip_links

log = logging.getLogger(__name__)

SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html", ".htm": "html"}
DEFAULT_BASE_URL = "https://docs.osserve.invalid/"
TOKEN = re.compile(r"(?u)\b\w\w+\b")
HEADING_MARK = re.compile(r"(?m)^\s*#+\s")


def demo_corpus() -> Path:
    """The documents shipped with osserve (about osserve and gpt-oss), for `--tool-server demo`."""
    return Path(str(resources.files("osserve.tools.browser") / "demo_corpus"))


@dataclass(frozen=True)
class Document:
    key: str  # path inside the folder, with / separators
    url: str
    page: Page
    plain: str  # what is searched: the title and the text without link markup


def read_documents(folder: Path, base_url: str, max_document_bytes: int) -> list[Document]:
    docs = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            kind = SUFFIXES.get(path.suffix.lower())
            if kind is None or path.is_symlink() or not path.is_file():
                continue
            with open(path, "rb") as f:
                raw = f.read(max_document_bytes + 1)
            if len(raw) > max_document_bytes:
                log.warning("%s is over %d bytes: only its start is served", path, max_document_bytes)
                raw = raw[:max_document_bytes]
            text = raw.decode("utf-8", errors="replace")
            key = path.relative_to(folder).as_posix()
            url = base_url + quote(key)
            title = path.stem.replace("-", " ").replace("_", " ")
            if kind == "html":
                text, found = html_to_markdown(text)
                title = found or title
            elif heading := next((line for line in text.splitlines() if line.strip()), ""):
                title = heading.lstrip("#").strip() if kind == "markdown" else heading.strip()
            page = markdown_page(text, url, title)
            body = page.text.split("\n", 2)[2]  # after the "URL: ..." header
            docs.append(Document(key, url, page, f"{title}\n{strip_links(body)}"))
    return docs


class OfflineBackend:
    """Search and open over the documents of `folder` (see the module docstring)."""

    def __init__(self, folder: Path | None = None, *, base_url: str = DEFAULT_BASE_URL,
                 source: str = "web", max_document_bytes: int = 1 << 20) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.folder = Path(folder) if folder is not None else demo_corpus()
        if not self.folder.is_dir():
            raise FileNotFoundError(f"the browser's document folder {self.folder} does not exist")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.source = source
        self.documents = read_documents(self.folder, self.base_url, max_document_bytes)
        if not self.documents:
            raise FileNotFoundError(f"no .md, .txt or .html documents under {self.folder}")
        self._by_url = {doc.url: doc for doc in self.documents}
        self._by_key = {doc.key: doc for doc in self.documents}
        self._tokenizer = Tokenizer(stopwords="en")
        corpus = self._tokenizer.tokenize([d.plain for d in self.documents], return_as="ids",
                                          show_progress=False)
        self._index = bm25s.BM25()
        self._index.index(corpus, show_progress=False)

    async def search(self, query: str, topn: int) -> list[SearchHit]:
        ids = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        k = max(1, min(topn, len(self.documents)))
        found, scores = self._index.retrieve(ids, k=k, show_progress=False)
        hits = []
        for index, score in zip(found[0], scores[0], strict=True):
            if score <= 0:
                continue
            doc = self.documents[int(index)]
            hits.append(SearchHit(doc.page.title, doc.url, summary_for(doc.plain, query)))
        return hits

    async def fetch(self, url: str) -> Page:
        doc = self.lookup(url)
        if doc is None:
            raise BackendError(f"`{url[:200]}` is not among the documents this browser can open")
        return doc.page

    def lookup(self, url: str) -> Document | None:
        """The document a URL (or a document's path in the folder) names; None for any other."""
        address = urldefrag(url.strip())[0]
        doc = self._by_url.get(address)
        if doc is None and address.startswith(self.base_url):
            doc = self._by_key.get(unquote(address[len(self.base_url):]))
        return doc or self._by_key.get(unquote(address))

    async def aclose(self) -> None:
        return None


def summary_for(plain: str, query: str, width: int = 240) -> str:
    """A stretch of the document around the first query word it contains (else its start)."""
    title, _, rest = plain.partition("\n")
    body = " ".join(HEADING_MARK.sub(" ", rest).split())
    if body.startswith(title):
        body = body[len(title):].lstrip()
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    words = [w for w in (w.lower() for w in TOKEN.findall(query)) if w not in STOPWORDS_EN_PLUS]
    lowered = body.lower()
    at = min((i for i in (lowered.find(w) for w in words) if i >= 0), default=0)
    start = max(0, at - width // 3)
    snippet = body[start:start + width]
    return ("…" if start > 0 else "") + snippet + ("…" if start + width < len(body) else "")
