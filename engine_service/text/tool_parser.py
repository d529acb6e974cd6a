"""Reading tool calls back out of a model's output, whole or cut off by max_tokens.

Three formats are read: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks,
bare JSON (one call object, several, or a list of them) and Python call syntax
(`get_weather(city="Paris")`, `[f(a=1), g(b=2)]`, read with `ast`, never evaluated).
Tagged calls may follow prose (`I'll check.\n<tool_call>...`), as models trained on that
format often write: the prose is the reply's content (see ProseSplitter). A bare JSON object
is a call only in a call's shape, a name and arguments (or parameters): `{"name": "x", ...}`
alone may be an answer that has a `name`.

Each complete call is its own entry, whatever follows it. When the output was cut
(`truncated`), its last call may be incomplete: it keeps its arguments as generated so far,
or is left out when not even its name is complete. Markup never ends up in arguments.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection
from dataclasses import dataclass

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_TAGS = (CALL_OPEN, CALL_CLOSE)
FENCE = "```"  # a Markdown code fence: a tag inside one is an example, not a call

_DECODER = json.JSONDecoder()
_ARGUMENT_KEYS = ("arguments", "parameters")
# The start of a call object whose name is complete; what follows "arguments": is kept raw.
_PARTIAL_CALL = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*(?:,\s*"(?:arguments|parameters)"\s*:\s*(.*)|'
                           r',?\s*"?[a-z]*"?\s*)\Z', re.S)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _prefixes_of(*parts: str) -> str:
    """A regex matching any prefix of the concatenated parts (each part a regex)."""
    pattern = ""
    for part in reversed(parts):
        pattern = f"(?:{part}{pattern})?"
    return pattern


# A call object cut before its name was complete: `{`, `{"na`, `{"name": "wea`.
_UNNAMED_CALL = re.compile(r"\{\s*" + _prefixes_of('"', "n", "a", "m", "e", r'"\s*', r":\s*", r'"(?:[^"\\]|\\.)*')
                           + r"\Z")


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object; only a prefix of it when not complete
    complete: bool = True


class _NotCalls(Exception):
    """The text is not (only) tool calls."""


class ProseSplitter:
    """Splits an output read piece by piece at its first `<tool_call>` outside a code fence: the
    prose before it is content, what follows is calls. Until the tag is certain, gives back the prose
    that is safe to send: all but a tail that may still become the tag (or a fence), together with
    the whitespace before that tail, which is dropped when calls follow."""

    def __init__(self) -> None:
        self.calls: str | None = None  # the output from the opening tag on, once it came
        self.gap = ""  # the whitespace dropped between the prose and the tag
        self._held = ""  # prose not given back yet
        self._in_fence = False

    def feed(self, text: str) -> str:
        """The prose now safe to send."""
        if self.calls is not None:
            self.calls += text
            return ""
        held, scanned = self._held + text, 0  # fences before `scanned` are counted
        while True:
            fence = held.find(FENCE, scanned)
            tag = -1 if self._in_fence else held.find(CALL_OPEN, scanned)
            if tag >= 0 and (fence < 0 or tag < fence):
                prose = held[:tag].rstrip()
                self.calls, self.gap, self._held = held[tag:], held[len(prose):tag], ""
                return prose
            if fence < 0:
                break
            self._in_fence = not self._in_fence
            scanned = fence + len(FENCE)
        partial = max(_partial_suffix(held, scanned, FENCE),
                      0 if self._in_fence else _partial_suffix(held, scanned, CALL_OPEN))
        keep = len(held) - partial
        keep = max(len(held[:keep].rstrip()), scanned)
        self._held = held[keep:]
        return held[:keep]

    def flush(self, cut: bool = False) -> str:
        """The held prose at the end of an output without calls. `cut`: the output was cut (max_tokens),
        and a tag it was starting is left out, as a cut-off call's markup is."""
        held, self._held = self._held, ""
        if cut and not self._in_fence and held.strip() and CALL_OPEN.startswith(held.strip()):
            return ""
        return held


def _partial_suffix(text: str, start: int, marker: str) -> int:
    """The length of the longest end of `text[start:]` that begins `marker` (and is not all of it)."""
    for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def parse_reply(text: str, tool_names: Collection[str], truncated: bool = False) -> tuple[str, list[ParsedCall] | None]:
    """A whole output as (content, calls): calls alone (content ""), prose then tagged calls, or
    (text, None) when it holds no calls. Streamed, OutputProcessor reaches the same split."""
    calls = parse_tool_calls(text, tool_names, truncated)
    if calls is not None:
        return "", calls
    splitter = ProseSplitter()
    prose = splitter.feed(text)
    if splitter.calls is None:
        return prose + splitter.flush(truncated), None
    calls = parse_tool_calls(splitter.calls, tool_names, truncated)
    return (prose, calls) if calls is not None else (text, None)


def parse_tool_calls(text: str, tool_names: Collection[str], truncated: bool = False) -> list[ParsedCall] | None:
    """The calls in `text`, or None when it is not tool calls (auto mode then treats it as content).
    [] means the output was cut before any call's name was complete."""
    body = text.strip()
    try:
        if body.startswith(CALL_OPEN) or (truncated and body and CALL_OPEN.startswith(body)):
            return _tagged_calls(body, tool_names, truncated)
        if body.startswith("{") or re.match(r"\[\s*(\{|\Z)", body):
            return _json_calls(body, tool_names, truncated)
        return _python_calls(body, tool_names, truncated)
    except _NotCalls:
        return None


def _tagged_calls(text: str, names: Collection[str], truncated: bool) -> list[ParsedCall]:
    """Blocks of `<tool_call>` JSON `</tool_call>`. A closing tag counts only after a whole JSON
    body: one inside an unfinished string is the model's slip, not the end of the call."""
    calls: list[ParsedCall] = []
    rest = text
    while rest:
        if not rest.startswith(CALL_OPEN):
            if truncated and CALL_OPEN.startswith(rest):
                break  # the next call's opening tag was cut
            raise _NotCalls
        body = rest[len(CALL_OPEN):].lstrip()
        try:
            item, end = _DECODER.raw_decode(body)
        except ValueError:
            if not truncated:
                raise _NotCalls from None
            call = _partial_call(body, names)
            return calls + ([call] if call else [])
        calls.append(_as_call(item, body[:end], names))
        tail = body[end:].lstrip()
        if tail.startswith(CALL_CLOSE):
            rest = tail[len(CALL_CLOSE):].lstrip()
        elif not tail or (truncated and CALL_CLOSE.startswith(tail)):
            break  # the model ended without the closing tag, or it was cut
        else:
            raise _NotCalls
    return calls


def _json_calls(text: str, names: Collection[str], truncated: bool) -> list[ParsedCall]:
    """One call object, several separated by whitespace or commas, or a JSON list of them."""
    calls: list[ParsedCall] = []
    in_list = text.startswith("[")
    pos = 1 if in_list else 0
    while True:
        pos = _skip(text, pos, " \t\r\n," if calls else " \t\r\n")
        if pos == len(text):
            if in_list and not truncated:
                raise _NotCalls  # an unclosed list
            return calls
        if in_list and text[pos] == "]":
            if text[pos + 1:].strip():
                raise _NotCalls
            return calls
        try:
            item, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            call = _object_call(text[pos:], names, truncated)
            return calls + ([call] if call else [])
        calls.append(_as_call(item, text[pos:end], names, bare=True))
        pos = end


def _object_call(body: str, names: Collection[str], truncated: bool) -> ParsedCall | None:
    """A call written as a JSON object; when `truncated` and incomplete, its partial form, or None
    when not even its name is complete."""
    body = body.strip()
    try:
        item, end = _DECODER.raw_decode(body)
    except ValueError:
        if not truncated:
            raise _NotCalls from None
        return _partial_call(body, names)
    if body[end:].strip():
        raise _NotCalls
    return _as_call(item, body[:end], names, bare=True)


def _partial_call(body: str, names: Collection[str]) -> ParsedCall | None:
    if not body or _UNNAMED_CALL.match(body):
        return None  # cut before the name was complete
    match = _PARTIAL_CALL.match(body)
    if match is None:
        raise _NotCalls
    name = json.loads(f'"{match.group(1)}"')
    if name not in names:
        raise _NotCalls
    return ParsedCall(name, _without_markup(match.group(2) or ""), complete=False)


def _without_markup(arguments: str) -> str:
    """Partial arguments up to any tool-call tag in them (a model that forgot to close a string
    may write its closing tag inside it), without a trailing piece that may become a tag."""
    for tag in (CALL_CLOSE, CALL_OPEN):
        at = arguments.find(tag)
        if at >= 0:
            arguments = arguments[:at]
    for k in range(min(len(arguments), len(CALL_OPEN)), 0, -1):
        if CALL_CLOSE.startswith(arguments[-k:]) or CALL_OPEN.startswith(arguments[-k:]):
            return arguments[:-k]
    return arguments


def _as_call(item: object, raw: str, names: Collection[str], bare: bool = False) -> ParsedCall:
    """A decoded call object -> its name and the arguments' JSON text as the model wrote it. Inside
    tags a call may leave out its arguments; `bare`, it must have them to be told from an answer."""
    if not isinstance(item, dict) or item.get("name") not in names:
        raise _NotCalls
    key = next((k for k in _ARGUMENT_KEYS if k in item), None)
    if bare and key is None:
        raise _NotCalls
    arguments = item.get(key, {}) if key else {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise _NotCalls from None
        if not isinstance(arguments, dict):
            raise _NotCalls
        return ParsedCall(item["name"], json.dumps(arguments, ensure_ascii=False))
    if not isinstance(arguments, dict):
        raise _NotCalls
    return ParsedCall(item["name"], _raw_value(raw, key, arguments) if key else "{}")


def _raw_value(raw: str, key: str, value: object) -> str:
    """The text of `"key": value` inside `raw`, as written, so streamed pieces and the final call agree."""
    for match in re.finditer(rf'"{key}"\s*:\s*', raw):
        try:
            decoded, end = _DECODER.raw_decode(raw, match.end())
        except ValueError:
            continue
        if decoded == value:
            return raw[match.end():end]
    return json.dumps(value, ensure_ascii=False)


def _python_calls(text: str, names: Collection[str], truncated: bool) -> list[ParsedCall]:
    """`f(a=1)` or `[f(a=1), g(b=2)]`. A cut-off last call keeps the keyword arguments completed so
    far, as an unclosed JSON object."""
    calls = _python_call_list(text, names)
    if calls is not None:
        return calls
    if not truncated:
        raise _NotCalls
    in_list = text.startswith("[")
    # The longest prefix that ends a call, then what was started after it.
    for cut in (i for i in range(len(text), 0, -1) if text[i - 1] == ")"):
        calls = _python_call_list(text[:cut] + ("]" if in_list else ""), names)
        if calls is not None:
            return calls + _partial_python_call(text[cut:].lstrip(" ,\n"), names)
    return _partial_python_call(text[1:].lstrip() if in_list else text, names)


def _partial_python_call(text: str, names: Collection[str]) -> list[ParsedCall]:
    match = _IDENTIFIER.match(text)
    if not text or match is None:
        if text:
            raise _NotCalls
        return []
    name, rest = match.group(0), text[match.end():]
    if not rest.startswith("("):
        if rest or not any(tool.startswith(name) for tool in names):
            raise _NotCalls
        return []  # the name itself was cut
    if name not in names:
        raise _NotCalls
    inner = rest[1:]
    for cut in [len(inner)] + [i for i in range(len(inner) - 1, -1, -1) if inner[i] == ","]:
        done = _python_call_list(f"{name}({inner[:cut]})", names)
        if done is not None:
            arguments = done[0].arguments
            return [ParsedCall(name, arguments[:-1] if arguments != "{}" else "", complete=False)]
    return [ParsedCall(name, "", complete=False)]


def _python_call_list(text: str, names: Collection[str]) -> list[ParsedCall] | None:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls: list[ParsedCall] = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                and node.func.id in names):
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except ValueError:
            return None
        calls.append(ParsedCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
    return calls


def _skip(text: str, pos: int, chars: str) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos
