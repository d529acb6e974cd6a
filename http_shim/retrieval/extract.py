"""A file's text, by its format: plain text, Markdown, source code and JSON as they are (UTF-8 or
UTF-16 with a BOM), HTML without its markup, scripts and styles, PDF through pypdf. Anything else is
an UnsupportedFile; bytes that do not decode as their format says are an InvalidFile."""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser
from pathlib import PurePosixPath

TEXT_SUFFIXES = {
    ".txt", ".md", ".markdown", ".rst", ".text", ".log", ".csv", ".tsv", ".tex", ".json", ".jsonl", ".yaml",
    ".yml", ".toml", ".ini", ".cfg", ".xml", ".css", ".py", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".java", ".c",
    ".h", ".cc", ".cpp", ".hpp", ".cs", ".go", ".rs", ".rb", ".php", ".sh", ".bash", ".swift", ".kt", ".scala",
    ".sql", ".r", ".lua", ".pl", ".proto",
}
HTML_SUFFIXES = {".html", ".htm"}
PDF_SUFFIXES = {".pdf"}


class UnsupportedFile(Exception):
    """A format this server cannot read (last_error code `unsupported_file`)."""


class InvalidFile(Exception):
    """A supported format whose bytes cannot be read as it (`invalid_file`)."""


def extract_text(filename: str, data: bytes) -> str:
    suffix = PurePosixPath(filename.lower()).suffix
    if suffix in PDF_SUFFIXES or (not suffix and data.startswith(b"%PDF-")):
        return _pdf(data)
    if suffix in HTML_SUFFIXES:
        return _html(_decode(data))
    if suffix in TEXT_SUFFIXES or not suffix:
        text = _decode(data)
        if suffix == ".json":
            try:
                json.loads(text)
            except ValueError:
                raise InvalidFile("The file is not valid JSON.") from None
        return text
    raise UnsupportedFile(f"Files of type {suffix} are not supported: plain text, Markdown, source code, JSON, "
                          "HTML and PDF are.")


def _decode(data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        raise InvalidFile(f"The file is not valid {encoding.upper().removesuffix('-SIG')} text.") from None
    if "\x00" in text:
        raise InvalidFile("The file holds binary data, not text.")
    return text


def _pdf(data: bytes) -> str:
    from pypdf import PdfReader  # imported when a PDF comes: most shims never read one
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        return "\n\n".join((page.extract_text() or "").strip() for page in reader.pages)
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as error:
        raise InvalidFile(f"The PDF could not be read: {error}") from None


class _HtmlText(HTMLParser):
    SKIPPED = {"script", "style", "noscript", "template", "head"}
    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre",
              "table", "ul", "ol", "blockquote", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self.SKIPPED:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def _html(markup: str) -> str:
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)
