"""The docs stay true to the code and readable: docs/flags.md is what the parsers generate today, no
doc line is over ~120 characters, and every relative link (file and #anchor) leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conduit_common import flagdoc

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_LINE = 120
DOCS = sorted([REPO_ROOT / "README.md", REPO_ROOT / "tests" / "README.md", *(REPO_ROOT / "docs").glob("*.md")])
# [text](target): a relative target, with an optional #anchor; not http(s)/mailto links.
LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s]*)\)")


def test_flag_reference_is_generated_from_the_parsers():
    current = (REPO_ROOT / flagdoc.DEFAULT_OUT).read_text()
    assert current == flagdoc.render(), "docs/flags.md is stale: run 'make docs'"


def test_flag_reference_names_every_flag_and_variable():
    page = flagdoc.render()
    for _command, _form, module in flagdoc.PROGRAMS:
        parser = __import__(module, fromlist=["build_parser"]).build_parser()
        for action in flagdoc._options(parser):
            assert f"`{action.option_strings[0]}" in page
            for name in action.env_names:
                assert f"`{name}`" in page


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_no_doc_line_is_too_long(doc):
    long = [f"{doc.name}:{number}: {len(line)} characters"
            for number, line in enumerate(doc.read_text().splitlines(), 1) if len(line) > MAX_LINE]
    assert not long, "\n".join(long)


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_relative_links_lead_somewhere(doc):
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{doc.name}: broken links {broken}"
