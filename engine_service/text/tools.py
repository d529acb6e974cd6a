"""Tool calling: how tools reach the prompt, how calls are forced, how they stream back.

Models whose chat template knows `tools` get them through the template; others get a
system prompt asking for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
tool_choice "required" or a named function constrains decoding to exactly that shape
(so arguments always parse against the schema); "auto" lets the model choose, and
tool_parser reads back what it wrote.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import new_tool_call_id

from engine_service.core.params import InvalidRequest
from engine_service.text.tool_parser import CALL_CLOSE, CALL_OPEN, ParsedCall, parse_tool_calls

# Compact separators: small models otherwise wander into endless whitespace.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class ToolCallDelta:
    """A streamed piece of a call: the first piece of a call has its id and name."""

    index: int
    id: str
    name: str
    arguments: str


class CallStreamer:
    """Streams forced calls as OpenAI deltas while they are generated: a call's id and name once its
    name is complete, then its argument text as it grows. Fed the parse of the whole output so
    far; the forced-call grammar makes each parse's arguments extend the previous one's."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._sent: list[str] = []  # argument text already sent, per call

    def feed(self, calls: list[ParsedCall]) -> list[ToolCallDelta]:
        deltas: list[ToolCallDelta] = []
        for k, call in enumerate(calls):
            if k == len(self.ids):
                self.ids.append(new_tool_call_id())
                self._sent.append("")
                deltas.append(ToolCallDelta(k, self.ids[k], call.name, ""))
            sent = self._sent[k]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                deltas.append(ToolCallDelta(k, "", "", call.arguments[len(sent):]))
                self._sent[k] = call.arguments
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
        # Parallel calls: one per line, and the output may end after any of them (a newline
        # included), so a model that is done is not pushed into writing another call.
        repeat = ' ("\\n" call)* "\\n"?' if self.parallel else ""
        return (f"start: call{repeat}\n"
                f"call: {json.dumps(CALL_OPEN)} body {json.dumps(CALL_CLOSE)}\n"
                f"body: %json {json.dumps(body)}\n")

    def may_be_call(self, text: str) -> bool:
        """Could this output still turn into a tool call? While it could, its text is held back."""
        if self.forced:
            return True
        head = text.lstrip()
        if not head:
            return True
        if head[0] in "{[" or CALL_OPEN.startswith(head[:len(CALL_OPEN)]) or head.startswith(CALL_OPEN):
            return True
        name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", head)
        if name is None:
            return False
        word = name.group(0)
        rest = head[len(word):]
        if rest == "":
            return any(tool.startswith(word) for tool in self.tools)
        return word in self.tools and rest.startswith("(")

    def parse(self, text: str, truncated: bool = False) -> list[ParsedCall] | None:
        """The calls in an output (see tool_parser); None when it is plain text."""
        calls = parse_tool_calls(text, self.tools, truncated)
        return calls if calls is None or self.parallel else calls[:1]


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
