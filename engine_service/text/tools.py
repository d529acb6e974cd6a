"""Tool calling: how tools reach the prompt, how calls are forced, how they stream back.

Models whose chat template knows `tools` get them through the template; others get a
system prompt asking for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
tool_choice "required" or a named function constrains decoding to exactly that shape
(so arguments always parse against the schema); "auto" lets the model choose, and
tool_parser reads back what it wrote. A response format beside tools applies to the final
answer, as at OpenAI: on "auto" the output is either calls or an answer in that format (one
grammar allows both); a forced call is this turn's output, and the format waits for a later turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import new_tool_call_id

from engine_service.core.params import InvalidRequest
from engine_service.text.json_schemas import JSON_OPTIONS, closed_objects, placed_at
from engine_service.text.tool_parser import CALL_OPEN, CALL_TAGS, ParsedCall, parse_tool_calls

# Where a call's object names its arguments: most formats say "arguments", Llama 3's "parameters".
_ARGUMENT_KEYS = ("arguments", "parameters")
# The start rules of a grammar of calls alone, and of calls or an answer (see ToolSpec.grammar, calls_only).
_CALLS_ONLY, _CALLS_OR_ANSWER = "start: calls\n", "start: calls | @answer\n"
# The first key of a JSON object (or of a list's first object), once it is complete.
_FIRST_KEY = re.compile(r'\[?\s*\{\s*"((?:[^"\\]|\\.)*)"\s*:')


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
    positions: dict[str, int]  # each tool's index in the request, for errors

    @classmethod
    def from_chat(cls, chat: pb.ChatInput) -> "ToolSpec | None":
        if not chat.tools or chat.tool_choice.mode == pb.ToolChoice.MODE_NONE:
            return None
        tools: dict[str, dict] = {}
        for i, tool in enumerate(chat.tools):
            if not tool.name:
                raise InvalidRequest("every tool needs a name", "chat.tools")
            try:
                params = json.loads(tool.parameters_json) if tool.parameters_json else {"type": "object"}
            except ValueError as exc:
                raise InvalidRequest(f"tool {tool.name!r}: parameters are not valid JSON: {exc}",
                                     f"chat.tools[{i}].parameters_json") from exc
            if not isinstance(params, (dict, bool)):
                raise InvalidRequest(f"tool {tool.name!r}: parameters must be a JSON Schema object",
                                     f"chat.tools[{i}].parameters_json")
            tools[tool.name] = params
        choice = chat.tool_choice
        if choice.mode == pb.ToolChoice.MODE_FUNCTION and choice.function_name not in tools:
            raise InvalidRequest(f"tool_choice names {choice.function_name!r}, which is not among the tools",
                                 "chat.tool_choice")
        return cls(tools=tools, descriptions={t.name: t.description for t in chat.tools}, mode=choice.mode,
                   function_name=choice.function_name,
                   parallel=chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else True,
                   positions={t.name: i for i, t in enumerate(chat.tools)})

    @property
    def forced(self) -> bool:
        return self.mode in (pb.ToolChoice.MODE_REQUIRED, pb.ToolChoice.MODE_FUNCTION)

    def openai_tools(self) -> list[dict]:
        return [{"type": "function", "function": {"name": name, "description": self.descriptions[name],
                                                  "parameters": params}}
                for name, params in self.tools.items()]

    def system_prompt(self, answer_format: pb.Constraint | None = None) -> str:
        """Tools for a template that knows none; `answer_format` (the request's constraint) tells
        the model what shape an answer without calls takes, as the grammar will enforce."""
        listing = "\n".join(json.dumps(t["function"]) for t in self.openai_tools())
        if self.mode == pb.ToolChoice.MODE_FUNCTION:
            rule = f"You must call the function {self.function_name!r}."
        elif self.mode == pb.ToolChoice.MODE_REQUIRED:
            rule = "You must call one of these functions."
        else:
            rule = "Call a function only when it helps answer; " + _answer_rule(answer_format)
        return ("You can call these functions:\n" + listing + "\n" + rule +
                "\nTo call a function, reply with only:\n"
                '<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>')

    def grammar(self, answer: str | None = None, bare_calls: bool = False,
                tag_tokens: dict[str, int] | None = None) -> str | None:
        """This turn's output grammar (llguidance's JSON form), or None when it is free. Forced:
        well-formed calls only, in the `<tool_call>` form the forced path streams. On auto with
        `answer` (the response format's grammar): calls, or an answer that matches the format.
        `bare_calls`: calls may also be bare JSON objects (the model's chat template chose its own
        call format, and bare JSON is the other one the parser reads; our tool prompt asks for tags).
        `tag_tokens`: the call tags that are one special token to the grammar engine (Qwen's added
        `<tool_call>`), by id: the grammar names that token, as the engine matches no text to it."""
        tags = tag_tokens or {}
        if self.forced:
            names = [self.function_name] if self.mode == pb.ToolChoice.MODE_FUNCTION else list(self.tools)
            return json.dumps({"grammars": [self._calls_lark(_CALLS_ONLY, names, ("arguments",), False, tags)]})
        if answer is None:
            return None
        answer_grammars = json.loads(answer)["grammars"]
        answer_grammars[0]["name"] = "answer"
        calls = self._calls_lark(_CALLS_OR_ANSWER, list(self.tools), _ARGUMENT_KEYS, bare_calls, tags)
        return json.dumps({"grammars": [calls] + answer_grammars})

    def _calls_lark(self, start: str, names: list[str], keys: tuple[str, ...], bare: bool,
                    tag_tokens: dict[str, int]) -> dict:
        """A Lark grammar (`start`: its start rule) whose `calls` is one call, or with parallel calls
        one per line (the output may end after any of them, a newline included). One output's calls
        share one form, tagged or (with `bare`) bare JSON, as the parser reads them."""
        branches = []
        for name in names:
            for key in keys:
                # The parameters sit inside the wrapper: their own `#/$defs/...` refs must follow them.
                pointer = f"/anyOf/{len(branches)}/properties/{key}"
                branches.append({
                    "type": "object",
                    "properties": {"name": {"const": name}, key: placed_at(closed_objects(self.tools[name]), pointer)},
                    "required": ["name", key],
                    "additionalProperties": False,
                })
        body = {"anyOf": branches, "x-guidance": JSON_OPTIONS}
        open_, close = (f"<[{tag_tokens[tag]}]>" if tag in tag_tokens else json.dumps(tag) for tag in CALL_TAGS)
        forms = [f"{open_} body {close}"] + (["body"] if bare else [])
        calls = " | ".join(f'{form} ("\\n" {form})* "\\n"?' if self.parallel else form for form in forms)
        lark = (start +
                f"calls: {calls}\n"
                f"body: %json {json.dumps(body)}\n")
        return {"name": "calls", "lark_grammar": lark}

    @staticmethod
    def calls_only(grammar: str) -> str:
        """The calls branch alone of a calls-or-answer grammar from `grammar()`: a matcher following it
        tells, with one following the answer's grammar, which branch an output took."""
        calls = json.loads(grammar)["grammars"][0]
        if not calls["lark_grammar"].startswith(_CALLS_OR_ANSWER):
            raise ValueError("not a calls-or-answer grammar")
        calls["lark_grammar"] = _CALLS_ONLY + calls["lark_grammar"][len(_CALLS_OR_ANSWER):]
        return json.dumps({"grammars": [calls]})

    def schema_error(self, check: Callable[[object], str | None]) -> InvalidRequest | None:
        """The first tool whose parameters the grammar engine refuses, as an error naming it.
        `check` takes a schema and returns the engine's reason, or None when it compiles."""
        for name, params in self.tools.items():
            reason = check(closed_objects(params))
            if reason is not None:
                i = self.positions[name]
                return InvalidRequest(f"tools[{i}] ({name!r}): the parameters are not a JSON Schema this server can "
                                      f"enforce: {reason}", f"chat.tools[{i}].parameters_json")
        return None

    def may_be_call(self, text: str) -> bool:
        """Could this output still turn into a tool call? While it could, its text is held back."""
        if self.forced:
            return True
        head = text.lstrip()
        if not head:
            return True
        if head[0] in "{[":
            # A JSON answer (a response format's) streams once its first key shows it is no call.
            key = _FIRST_KEY.match(head)
            return key is None or key.group(1) in ("name", "type") + _ARGUMENT_KEYS
        if CALL_OPEN.startswith(head[:len(CALL_OPEN)]) or head.startswith(CALL_OPEN):
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


def _answer_rule(answer_format: pb.Constraint | None) -> str:
    """How the prompt says to answer without calls: in the response format when there is one."""
    kind = answer_format.WhichOneof("kind") if answer_format is not None else None
    if kind == "json_schema":
        shape = f"a JSON object that follows this JSON Schema: {answer_format.json_schema}"
    elif kind == "json_object" and answer_format.json_object:
        shape = "a JSON object"
    else:
        return "otherwise answer normally."
    return f"once a function's result is here, use it instead of calling again. Otherwise answer with only {shape}"
