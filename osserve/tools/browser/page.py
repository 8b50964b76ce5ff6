"""A page as harmony's browser shows it: plain text whose links read `【id†text†domain】` (the
domain only where it differs from the page's own), an id -> URL map, lines wrapped at 80 columns.

HTML becomes markdown through markdownify (scripts, styles and the head dropped first); markdown
links become the `【…】` form, images `[Image N: alt]`. Brackets a page writes itself (`【`, `】`)
are replaced by look-alikes, so a page cannot forge a link or a citation.
"""

from __future__ import annotations

import itertools
import re
import textwrap
from dataclasses import dataclass
from urllib.parse import urljoin, urlparse

MAX_HTML_CHARS = 2_000_000  # bigger documents are cut before parsing
MARKDOWN_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s]*)(?:\s+\"[^\"]*\")?\)")
MARKDOWN_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
LINK_MARKUP = re.compile(r"【\d+†(?P<content>[^†】]+)(?:†[^†】]+)?】")
WHITESPACE = re.compile(r"\s+")
BLOCK_START = re.compile(r"^\s*(#|>|\||[*+-]\s|\d+[.)]\s|```|~~~|<)")
BLANK_LINES = re.compile(r"\n(\s*\n)+")


@dataclass(frozen=True)
class Extract:
    """A passage a result page points into: opening its link lands near `line_idx`."""

    url: str
    text: str
    title: str
    line_idx: int | None = None


@dataclass
class Page:
    url: str
    title: str
    text: str
    urls: dict[str, str]  # link id -> absolute URL
    snippets: dict[str, Extract] | None = None  # set on find-result pages only

    def lines(self) -> list[str]:
        return wrap_lines(self.text)


def domain_of(url: str) -> str:
    return urlparse(url if "//" in url else "//" + url).netloc


def clean_text(text: str) -> str:
    """Text from outside with the browser's own markup characters replaced by look-alikes."""
    return text.replace("【", "〖").replace("】", "〗").replace("\u200b", "")


def wrap_lines(text: str, width: int = 80) -> list[str]:
    """Lines as the model sees them (L0, L1...): long lines wrapped, empty lines kept."""
    return list(itertools.chain.from_iterable(
        textwrap.wrap(line, width=width, replace_whitespace=False, drop_whitespace=False) if line else [""]
        for line in text.split("\n")))


def strip_links(text: str) -> str:
    return LINK_MARKUP.sub(lambda m: m.group("content"), text)


def reflow(markdown: str) -> str:
    """Paragraphs written over several source lines joined into one line each (as a browser
    shows a web page's paragraph), so the 80-column wrap does not leave half-empty lines. Headings,
    lists, quotes, tables and code blocks keep their lines."""
    out: list[str] = []
    in_code = False
    joinable = False  # the previous line is paragraph text
    for line in markdown.split("\n"):
        fence = line.lstrip().startswith(("```", "~~~"))
        if in_code or fence:
            in_code = in_code != fence
            out.append(line)
            joinable = False
        elif joinable and line.strip() and not BLOCK_START.match(line):
            out[-1] = out[-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
            joinable = bool(line.strip()) and not BLOCK_START.match(line) and not line.endswith("  ")
    return "\n".join(out)


def markdown_page(markdown: str, url: str, title: str) -> Page:
    """A page from markdown (or plain text): links to http(s) addresses get ids, others keep
    their text only."""
    urls: dict[str, str] = {}
    ids: dict[str, str] = {}
    own_domain = domain_of(url)
    images = itertools.count()

    def image(match: re.Match[str]) -> str:
        alt = match.group(1).strip()
        return f"[Image {next(images)}: {alt}]" if alt else f"[Image {next(images)}]"

    def link(match: re.Match[str]) -> str:
        text = WHITESPACE.sub(" ", match.group(1)).strip().replace("†", "‡")
        target = urljoin(url, match.group(2)) if url else match.group(2)
        if not text or urlparse(target).scheme not in ("http", "https") or match.group(2).startswith("#"):
            return text
        link_id = ids.setdefault(target, str(len(ids)))
        urls[link_id] = target
        domain = domain_of(target)
        return f"【{link_id}†{text}】" if domain == own_domain else f"【{link_id}†{text}†{domain}】"

    body = MARKDOWN_LINK.sub(link, MARKDOWN_IMAGE.sub(image, clean_text(reflow(markdown))))
    body = BLANK_LINES.sub("\n\n", body.strip())
    return Page(url=url, title=clean_text(title), text=f"\nURL: {url}\n{body}", urls=urls)


def html_to_markdown(html: str) -> tuple[str, str]:
    """(markdown, title) of an HTML document."""
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    soup = BeautifulSoup(html[:MAX_HTML_CHARS], "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(["script", "style", "noscript", "template", "head", "svg", "math"]):
        tag.decompose()
    markdown = MarkdownConverter(heading_style="ATX", bullets="*").convert_soup(soup)
    return markdown, title


def html_page(html: str, url: str, title: str | None = None) -> Page:
    markdown, found = html_to_markdown(html)
    return markdown_page(markdown, url, title or found or domain_of(url))
