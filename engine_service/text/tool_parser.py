"""Reading tool calls back out of a model's output, whole or cut off by max_tokens.

Three formats are read: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks,
bare JSON (one call object, several, or a list of them) and Python call syntax
(`get_weather(city="Paris")`, `[f(a=1), g(b=2)]`, read with `ast`, never evaluated).
Tagged calls may mix with prose (`I'll check.\n<tool_call>...</tool_call>\nThen I'll tell you.`),
as models trained on that format often write: the calls are calls and the prose is the reply's
content, in the order written (see ReplySplitter). A bare JSON object
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


class ReplySplitter:
    """Splits an output read piece by piece into prose and tagged calls, in the order written: each
    `<tool_call>` block outside a code fence that holds a call of a known tool is that call, as soon as
    its closing tag comes; the prose around the blocks is content. A block that turns out not to be a
    call (no JSON object after its tag, an unknown name, something other than its closing tag after
    the object) is prose itself, and reading goes on after its tag.

    Gives back the prose that is safe to send: never a tail that may still become a tag (or a fence),
    nor the whitespace before it. Whitespace next to a call is markup: dropped, except between a call
    and prose after it that has prose before the call too, which it keeps apart."""

    def __init__(self, tool_names: Collection[str]) -> None:
        self._names = tool_names
        self._held = ""  # text not given back yet: a prose tail, or a block from its opening tag on
        self._in_block = False  # `_held` starts with an opening tag
        self._gap = ""  # the whitespace between the prose and the open block
        self._in_fence = False
        self._wrote_prose = False
        self._after_call = False  # the last piece given back was a call

    def feed(self, text: str) -> list[str | ParsedCall]:
        """The prose and calls now certain, in order."""
        self._held += text
        return self._read()

    def finish(self, truncated: bool = False) -> list[str | ParsedCall]:
        """The rest at the end of the output. An open block is a call when it holds one (a missing
        closing tag aside); `truncated` (cut by max_tokens): its call keeps the arguments generated so
        far, or is left out with its markup when not even its name is complete, and a tag being
        written is left out."""
        out: list[str | ParsedCall] = []
        while self._in_block:
            try:
                calls = _tagged_calls(self._held, self._names, truncated)
            except _NotCalls:
                out += self._block_is_prose() + self._read()
                continue
            self._held, self._in_block, self._gap = "", False, ""
            out += self._calls(calls)
        held, self._held = self._held, ""
        if truncated and not self._in_fence and held.strip() and CALL_OPEN.startswith(held.strip()):
            return out
        return out + self._prose(held, last=True)

    def _read(self) -> list[str | ParsedCall]:
        out: list[str | ParsedCall] = []
        while True:
            if self._in_block:
                verdict = self._block_verdict()
                if verdict is None:
                    return out
                if isinstance(verdict, tuple):
                    call, end = verdict
                    self._held, self._in_block, self._gap = self._held[end:], False, ""
                    out += self._calls([call])
                else:
                    out += self._block_is_prose()
                continue
            out += self._read_prose()
            if not self._in_block:
                return out

    def _read_prose(self) -> list[str]:
        """Prose up to the next opening tag outside a fence (which opens a block), or up to a tail
        that may still become one."""
        held, scanned = self._held, 0  # fences before `scanned` are counted
        while True:
            fence = held.find(FENCE, scanned)
            tag = -1 if self._in_fence else held.find(CALL_OPEN, scanned)
            if tag >= 0 and (fence < 0 or tag < fence):
                prose = held[:tag].rstrip()
                self._held, self._gap, self._in_block = held[tag:], held[len(prose):tag], True
                return self._prose(prose)
            if fence < 0:
                break
            self._in_fence = not self._in_fence
            scanned = fence + len(FENCE)
        partial = max(_partial_suffix(held, scanned, FENCE),
                      0 if self._in_fence else _partial_suffix(held, scanned, CALL_OPEN))
        keep = max(len(held[:len(held) - partial].rstrip()), scanned)
        self._held = held[keep:]
        return self._prose(held[:keep])

    def _block_verdict(self) -> tuple[ParsedCall, int] | bool | None:
        """The open block's call and its length, once its closing tag came; False when it is no
        call; None while it cannot tell."""
        after_tag = self._held[len(CALL_OPEN):]
        body = after_tag.lstrip()
        if not body:
            return None
        if not body.startswith("{"):
            return False
        try:
            item, end = _DECODER.raw_decode(body)
        except ValueError:
            return None  # unfinished (or never valid: told at the end)
        tail = body[end:].lstrip()
        if not tail.startswith(CALL_CLOSE):
            return None if CALL_CLOSE.startswith(tail) else False
        try:
            call = _as_call(item, body[:end], self._names)
        except _NotCalls:
            return False
        return call, len(self._held) - len(tail) + len(CALL_CLOSE)

    def _block_is_prose(self) -> list[str]:
        """The open block read as prose: its opening tag (with the whitespace before it) is text, and
        reading goes on after it."""
        self._held, self._in_block = self._held[len(CALL_OPEN):], False
        prose, self._gap = self._gap + CALL_OPEN, ""
        return self._prose(prose)

    def _calls(self, calls: list[ParsedCall]) -> list[ParsedCall]:
        self._after_call = self._after_call or bool(calls)
        return list(calls)

    def _prose(self, text: str, last: bool = False) -> list[str]:
        """`text` as prose given back: after a call, its leading whitespace only where prose came
        before that call too (`last`: the end of the output, where whitespace after a call is dropped)."""
        if self._after_call:
            if not self._wrote_prose or (last and not text.strip()):
                text = text.lstrip()
            if not text:
                return []
            self._after_call = False
        if not text:
            return []
        self._wrote_prose = True
        return [text]


def _partial_suffix(text: str, start: int, marker: str) -> int:
    """The length of the longest end of `text[start:]` that begins `marker` (and is not all of it)."""
    for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def parse_reply(text: str, tool_names: Collection[str], truncated: bool = False) -> tuple[str, list[ParsedCall] | None]:
    """A whole output as (content, calls): calls alone (content ""), prose and tagged calls (the
    prose joined), or (text, None) when it holds no calls. Streamed, OutputProcessor reaches the
    same split."""
    calls = parse_tool_calls(text, tool_names, truncated)
    if calls is not None:
        return "", calls
    splitter = ReplySplitter(tool_names)
    pieces = splitter.feed(text) + splitter.finish(truncated)
    calls = [piece for piece in pieces if isinstance(piece, ParsedCall)]
    return "".join(piece for piece in pieces if isinstance(piece, str)), calls or None


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
