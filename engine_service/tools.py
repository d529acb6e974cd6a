"""Tool calling: how tools reach the prompt, how calls are forced, how calls are read back.

Models whose chat template knows `tools` get them through the template; others get a
system prompt asking for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
tool_choice "required" or a named function constrains decoding to exactly that shape
(so arguments always parse against the schema); "auto" lets the model choose and we
parse what it wrote: <tool_call> blocks, a bare JSON call, or Python call syntax
(parsed with `ast`, never evaluated).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass

from conduit.v1 import engine_pb2 as pb

from engine_service.params import InvalidRequest

# Compact separators: small models otherwise wander into endless whitespace.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class ToolCallDelta:
    """A streamed piece of a call: the first piece of a call has its id and name."""

    index: int
    id: str
    name: str
    arguments: str


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ForcedCallStreamer:
    """Streams calls made under the forced-call grammar as they are generated. The grammar fixes
    their text to `<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>`, so the header
    and the argument text can be cut out as they arrive."""

    _HEADER = re.compile(r'<tool_call>\{"name": "([^"]+)", "arguments": ')
    _CLOSE = "}</tool_call>"

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._sent: list[int] = []  # argument characters already sent, per call

    def feed(self, text: str, final: bool = False) -> list[ToolCallDelta]:
        """`text` is the whole output so far; returns what is new. Until a call's closing tag
        arrives, its last few characters are held back (they may be that tag)."""
        deltas: list[ToolCallDelta] = []
        headers = list(self._HEADER.finditer(text))
        for k, header in enumerate(headers):
            end = headers[k + 1].start() if k + 1 < len(headers) else len(text)
            region = text[header.end():end]
            close = region.find(self._CLOSE)
            if close >= 0:
                arguments = region[:close]
            elif final:
                arguments = region
            else:
                arguments = region[:max(0, len(region) - len(self._CLOSE))]
            if k == len(self.ids):
                self.ids.append(new_call_id())
                self._sent.append(0)
                deltas.append(ToolCallDelta(k, self.ids[k], header.group(1), ""))
            if len(arguments) > self._sent[k]:
                deltas.append(ToolCallDelta(k, "", "", arguments[self._sent[k]:]))
                self._sent[k] = len(arguments)
        return deltas


@dataclass
class ToolSpec:
    """What a request allows: the tools (name -> parameters schema) and the choice mode."""

    tools: dict[str, dict]
    descriptions: dict[str, str]
    mode: int  # pb.ToolChoice.Mode
    function_name: str
    parallel: bool

    @classmethod
    def from_chat(cls, chat: pb.ChatInput) -> "ToolSpec | None":
        if not chat.tools or chat.tool_choice.mode == pb.ToolChoice.MODE_NONE:
            return None
        tools: dict[str, dict] = {}
        for tool in chat.tools:
            if not tool.name:
                raise InvalidRequest("every tool needs a name", "chat.tools")
            try:
                params = json.loads(tool.parameters_json) if tool.parameters_json else {"type": "object"}
            except ValueError as exc:
                raise InvalidRequest(f"tool {tool.name!r}: parameters are not valid JSON: {exc}", "chat.tools") from exc
            tools[tool.name] = params
        choice = chat.tool_choice
        if choice.mode == pb.ToolChoice.MODE_FUNCTION and choice.function_name not in tools:
            raise InvalidRequest(f"tool_choice names {choice.function_name!r}, which is not among the tools",
                                 "chat.tool_choice")
        return cls(tools=tools, descriptions={t.name: t.description for t in chat.tools}, mode=choice.mode,
                   function_name=choice.function_name,
                   parallel=chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else True)

    @property
    def forced(self) -> bool:
        return self.mode in (pb.ToolChoice.MODE_REQUIRED, pb.ToolChoice.MODE_FUNCTION)

    def openai_tools(self) -> list[dict]:
        return [{"type": "function", "function": {"name": name, "description": self.descriptions[name],
                                                  "parameters": params}}
                for name, params in self.tools.items()]

    def system_prompt(self) -> str:
        listing = "\n".join(json.dumps(t["function"]) for t in self.openai_tools())
        if self.mode == pb.ToolChoice.MODE_FUNCTION:
            rule = f"You must call the function {self.function_name!r}."
        elif self.mode == pb.ToolChoice.MODE_REQUIRED:
            rule = "You must call one of these functions."
        else:
            rule = "Call a function only when it helps answer; otherwise answer normally."
        return ("You can call these functions:\n" + listing + "\n" + rule +
                "\nTo call a function, reply with only:\n"
                '<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>')

    def grammar(self) -> str | None:
        """A Lark grammar (llguidance dialect) that forces well-formed calls, or None for auto."""
        if not self.forced:
            return None
        names = [self.function_name] if self.mode == pb.ToolChoice.MODE_FUNCTION else list(self.tools)
        body = {"anyOf": [{
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": closed_objects(self.tools[name])},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        } for name in names], "x-guidance": JSON_OPTIONS}
        repeat = ' ("\\n" call)*' if self.parallel else ""
        return (f"start: call{repeat}\n"
                f'call: "<tool_call>" body "</tool_call>"\n'
                f"body: %json {json.dumps(body)}\n")

    def may_be_call(self, text: str) -> bool:
        """Could this output still turn into a tool call? While it could, its text is held back."""
        if self.forced:
            return True
        head = text.lstrip()
        if not head:
            return True
        if head[0] in "{[" or "<tool_call>".startswith(head[:11]) or head.startswith("<tool_call>"):
            return True
        name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", head)
        if name is None:
            return False
        word = name.group(0)
        rest = head[len(word):]
        if rest == "":
            return any(tool.startswith(word) for tool in self.tools)
        return word in self.tools and rest.startswith("(")

    def parse_truncated(self, text: str) -> list[ToolCall]:
        """A forced call cut off by max_tokens: its name and the argument text so far (OpenAI returns
        the partial arguments too, with finish_reason "length")."""
        match = re.search(r'"name":\s*"([^"]*)"?(?:,\s*"arguments":\s*(.*))?', text, re.S)
        if self.mode == pb.ToolChoice.MODE_FUNCTION:
            name = self.function_name
        else:
            started = [tool for tool in self.tools if match and tool.startswith(match.group(1))]
            if len(started) != 1:
                return []
            name = started[0]
        arguments = match.group(2) or "" if match else ""
        return [ToolCall(id=new_call_id(), name=name, arguments=arguments)]

    def parse(self, text: str) -> list[ToolCall]:
        """The tool calls in a finished output; [] when it is plain text."""
        candidates: list[object] = []
        blocks = _TOOL_CALL_BLOCK.findall(text)
        if blocks:
            candidates = [_loads(b) for b in blocks]
        else:
            stripped = text.strip()
            loaded = _loads(stripped)
            if loaded is not None:
                candidates = loaded if isinstance(loaded, list) else [loaded]
            else:
                candidates = _python_calls(stripped)
        calls = []
        for item in candidates:
            call = self._as_call(item)
            if call is None:
                return []  # anything unreadable: treat the whole output as text
            calls.append(call)
        return calls if self.parallel else calls[:1]

    def _as_call(self, item: object) -> ToolCall | None:
        if not isinstance(item, dict):
            return None
        name = item.get("name")
        args = item.get("arguments", item.get("parameters", {}))
        if name not in self.tools:
            return None
        if isinstance(args, str):
            args = _loads(args)
        if not isinstance(args, dict):
            return None
        return ToolCall(id=new_call_id(), name=name, arguments=json.dumps(args))


def closed_objects(schema: object) -> object:
    """The schema with `additionalProperties: false` wherever an object lists its properties and
    says nothing of others. Output valid under it is valid under the original, and small models
    otherwise invent keys until they run out of tokens."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed_objects(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _python_calls(text: str) -> list[object]:
    """`get_weather(city="Paris")` or `[f(a=1), g(b=2)]` -> [{"name", "arguments"}]; [] if not that."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return []
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls: list[object] = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            return []
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except ValueError:
            return []
        calls.append({"name": node.func.id, "arguments": args})
    return calls
