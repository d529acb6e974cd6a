"""The `file_search` tool of /v1/responses, run by this server.

The model is offered one function, `file_search(query)`. When it calls it, the call becomes a
`file_search_call` output item (never a function call the client must answer): the shim searches the
tool's vector stores (retrieval/search.py) and generates again with the results as the tool's answer,
until the model writes a message or the calls allowed (budget.py) are spent; then the tool is no longer
offered.

The rounds are chained by tool_rounds.py (as MCP calls are): between two rounds the event writer
(events.py) writes `response.file_search_call.searching` and `.completed`. So streamed and whole
answers, the drain, a client leaving and cancel work as for any response.

Citations (`file_citation` annotations) do not wait for the model to write markers, which small models
skip: each sentence of the answer cites the result whose words it shares most (at least
CITATION_MIN_SHARED content words), at the sentence's end (`index`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from conduit.v1 import engine_pb2 as pb

from ..errors import APIError
from ..retrieval.search import Hit, SearchOptions, search
from ..ids import new_id
from .budget import CallBudget

log = logging.getLogger("http_shim")
SEARCH_NAME = "file_search"
SEARCH_FUNCTION = pb.Tool(
    name=SEARCH_NAME,
    description="Search the user's documents for passages that answer a question. Call it with a short query "
                "before answering any question about the documents.",
    parameters_json=json.dumps({"type": "object", "properties": {"query": {
        "type": "string", "description": "what to look for"}}, "required": ["query"]}))
DEFAULT_RESULTS = 5  # passages fed to the model when the tool sets no max_num_results (CPU prefill is dear)
PASSAGE_CHARS = 1500  # of each passage in the model's prompt (the result's text stays whole)
CITATION_MIN_SHARED = 2
KIND = "file_search"  # its calls' kind in the budget
_WORD = re.compile(r"[^\W_]{4,}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_STOPWORDS = frozenset("that this with from have were what when where which about there their they them these "
                       "those would could should into also than then your yours does will been being more most "
                       "some such only other over very just like".split())


@dataclass
class SearchCall:
    """One call of the model's: its output item (shared with the writer), arguments, what it found."""

    item: dict[str, Any]
    call_id: str
    arguments: list[str] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)
    error: str | None = None
    model_name: str = SEARCH_NAME


class FileSearchRun:
    """One response's searches: the tool's settings, whose stores (the tenant's: checked before), and
    the calls so far."""

    def __init__(self, retrieval: Any, tool: Any, include_results: bool, budget: CallBudget,
                 request_id: str, fallback_query: str) -> None:
        self.retrieval = retrieval
        self.tool = tool
        self.include_results = include_results
        self.budget = budget
        self.request_id = request_id
        self.fallback_query = fallback_query  # the user's last words, if a call's arguments name no query
        self.calls: list[SearchCall] = []
        self.pending: list[SearchCall] = []  # called in this round, not yet searched

    def begin(self, call_id: str) -> dict[str, Any]:
        """A new call's item, as the writer adds it (in progress, no queries yet)."""
        call = SearchCall({"id": new_id("fs"), "type": "file_search_call", "status": "in_progress", "queries": [],
                           "results": None}, call_id)
        self.calls.append(call)
        self.pending.append(call)
        return call.item

    def call_of(self, item_id: str) -> SearchCall:
        return next(c for c in self.calls if c.item["id"] == item_id)

    def names(self) -> set[str]:
        return {SEARCH_NAME}

    def answers(self, model_name: str) -> bool:
        return model_name == SEARCH_NAME

    def can_call_again(self) -> bool:
        return self.budget.left(KIND)

    def _query(self, call: SearchCall) -> str:
        try:
            query = json.loads("".join(call.arguments) or "{}").get("query")
        except (ValueError, AttributeError):
            query = None
        return query.strip() if isinstance(query, str) and query.strip() else self.fallback_query

    def run_pending(self) -> None:
        """Runs the searches of this round's calls; each call's item ends completed (or failed)."""
        tool = self.tool
        for call in self.pending:
            self.budget.spend(KIND)
            query = self._query(call)
            call.item["queries"] = [query]
            options = SearchOptions.of([query], tool.filters, tool.max_num_results or DEFAULT_RESULTS,
                                       tool.ranking_options)
            try:
                r = self.retrieval
                call.hits = search(r.catalog, r.index, r.embedder, list(tool.vector_store_ids), options,
                                   self.request_id)
                call.item["status"] = "completed"
            except APIError as error:
                log.info("file search failed: %s", error.message)
                call.error = error.message
                call.item["status"] = "failed"
            if self.include_results and call.error is None:
                call.item["results"] = [{"file_id": h.file.file_id, "filename": h.file.filename, "score": h.score,
                                         "text": h.text, "attributes": h.file.attributes} for h in call.hits]

    def tool_answer(self, call: SearchCall) -> str:
        """What the model reads as the search's result."""
        if call.error is not None:
            return f"The search failed: {call.error}"
        if not call.hits:
            return "No passages of the user's files match the query."
        passages = [f"[{k + 1}] {h.file.filename}:\n{h.text[:PASSAGE_CHARS]}" for k, h in enumerate(call.hits)]
        return "Passages from the user's files:\n\n" + "\n\n".join(passages)

    def citations(self, text: str) -> list[dict[str, Any]]:
        """file_citation annotations for an answer, from the passages its sentences draw on."""
        hits = [h for c in self.calls for h in c.hits]
        if not hits:
            return []
        words = [_content_words(h.text) for h in hits]
        out: list[dict[str, Any]] = []
        start = 0
        for match in [*_SENTENCE_END.finditer(text), None]:
            end = match.start() if match is not None else len(text)
            sentence = _content_words(text[start:end])
            shared = [len(sentence & w) for w in words]
            best = max(range(len(hits)), key=shared.__getitem__)
            if shared[best] >= CITATION_MIN_SHARED:
                hit = hits[best]
                if not out or out[-1]["file_id"] != hit.file.file_id or out[-1]["index"] != end:
                    out.append({"type": "file_citation", "file_id": hit.file.file_id,
                                "filename": hit.file.filename, "index": end})
            start = match.end() if match is not None else len(text)
        return out


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}
