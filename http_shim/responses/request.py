"""A /v1/responses request (typed in protocol.py) -> the engine's GenerateRequest, plus what the answer echoes.

Input items become the chat the engine renders: `instructions` the first (system) message, consecutive
function calls the tool calls of the assistant turn before them, each function call output a `tool`
message, an MCP call (or a denied approval) both, reasoning items and MCP listings nothing. Functions
(a namespace's as NAMESPACE__NAME) and MCP servers' tools become the engine's tools, web search is left out, `text.format` becomes the constraint. What is served, refused and ignored, and
why: docs/responses.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from conduit.v1 import engine_pb2 as pb

from ..errors import APIError, invalid
from ..limits import RequestLimits
from ..protocol.chat import TOOL_NAME, chat_prompt_chars, check_prompt_chars, reasoning_options, schema_text, \
    tool_choice
from ..protocol.sampling import sampling_params, stopping_params
from ..mcp.protocol import McpApprovalRequestItem, McpApprovalResponseItem, McpCallItem, McpChoice, McpTool
from ..mcp.run import DENIED, tool_answer_of
from .objects import new_id
from .file_search import SEARCH_FUNCTION
from .protocol import (AllowedTools, FileSearch, FileSearchChoice, FunctionCallItem, FunctionCallOutputItem,
                       FunctionChoice, FunctionTool, HostedTool, InputItem, MessageItem, NamespaceTool, ResponseRequest,
                       Sent, TextPart)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
RESULTS_INCLUDE = "file_search_call.results"  # a file_search_call item shows its results only when asked
_NAMESPACE_JOIN = "__"  # NAMESPACE__NAME: the name the model sees for a function in a namespace
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
                "mcp_approval_response": "mcpa"}
# The engine's errors name chat fields (errors.openai_param); these are the Responses fields they come from.
_ENGINE_PARAMS = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens",
                  "reasoning_effort": "reasoning.effort"}
_ITEMS = TypeAdapter(list[InputItem])

if TYPE_CHECKING:
    from ..mcp.run import McpRun


@dataclass
class Tools:
    """The tools offered to the model, and what the answer needs to know of them."""

    offered: list[pb.Tool] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # each offered tool's place in the request (for errors)
    not_offered: list[str] = field(default_factory=list)  # hosted tool types accepted, not offered
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # NAMESPACE__NAME -> (namespace, name)
    file_search: FileSearch | None = None  # the hosted tool this server runs (responses/file_search.py)
    mcp: list[tuple[int, McpTool]] = field(default_factory=list)  # the mcp tools and their places (mcp/run.py)


@dataclass
class ResponsesRequest:
    """One validated /v1/responses request."""

    model: str
    generate: pb.GenerateRequest
    context: list[dict[str, Any]]  # every input item the answer is generated from (inherited ones first)
    echo: dict[str, Any]  # the request's settings, as the response object repeats them
    stream: bool
    store: bool
    logprobs: bool  # include asks for output_text logprobs
    tools: Tools
    include_results: bool = False  # include asks for file_search_call.results
    max_tool_calls: int | None = None

    def engine_error(self, error: APIError) -> APIError:
        """An engine error with the Responses name of the field at fault."""
        param = error.param or ""
        if param.startswith("tools[") and param.endswith("].function.parameters"):
            error.param = self.tools.paths[int(param[6:param.index("]")])] + ".parameters"
        else:
            error.param = _ENGINE_PARAMS.get(param, error.param)
        return error


def stored_item(item: Sent) -> dict[str, Any]:
    """An input item as stored and listed: typed, with an id, message content as parts."""
    out = {"type": item.type, **item.as_sent()}
    if isinstance(item, MessageItem) and isinstance(item.content, str):
        said = item.role == "assistant"
        out["content"] = [{"type": "output_text", "text": item.content, "annotations": []} if said
                          else {"type": "input_text", "text": item.content}]
    if item.type in _ID_PREFIXES:
        out.setdefault("id", new_id(_ID_PREFIXES[item.type]))
    if item.type in ("message", "function_call", "function_call_output"):
        out.setdefault("status", "completed")
    return out


def inherited_items(context: list[dict[str, Any]]) -> list[Sent]:
    """The stored context of `previous_response_id`, typed again."""
    try:
        return _ITEMS.validate_python(context)
    except ValidationError:
        raise invalid("'previous_response_id' names a response whose items cannot be read.",
                      "previous_response_id") from None


def _text(content: str | list[Sent]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.text if isinstance(part, TextPart) else part.refusal for part in content)


def qualified_name(namespace: str, name: str) -> str:
    return f"{namespace}{_NAMESPACE_JOIN}{name}"


def _call_message(messages: list[pb.ChatMessage], call: pb.ToolCall) -> None:
    """A call joins the assistant message before it, or starts one."""
    if messages and messages[-1].role == "assistant":
        messages[-1].tool_calls.append(call)
    else:
        messages.append(pb.ChatMessage(role="assistant", tool_calls=[call]))


def chat_messages(items: list[Sent]) -> list[pb.ChatMessage]:
    """Input items -> chat messages: consecutive function calls join the assistant message before them."""
    messages: list[pb.ChatMessage] = []
    asked: dict[str, McpApprovalRequestItem] = {}
    for item in items:
        if isinstance(item, McpApprovalRequestItem):
            asked[item.id] = item
        elif isinstance(item, McpCallItem):
            call_id = (item.model_extra or {}).get("id") or new_id("mcp")
            _call_message(messages, pb.ToolCall(id=call_id, name=item.name, arguments=item.arguments))
            messages.append(pb.ChatMessage(role="tool", tool_call_id=call_id, content=tool_answer_of(item.as_sent())))
        elif isinstance(item, McpApprovalResponseItem) and not item.approve and item.approval_request_id in asked:
            request = asked[item.approval_request_id]
            _call_message(messages, pb.ToolCall(id=request.id, name=request.name, arguments=request.arguments))
            messages.append(pb.ChatMessage(role="tool", tool_call_id=request.id, content=DENIED))
        elif isinstance(item, MessageItem):
            messages.append(pb.ChatMessage(role=item.role, content=_text(item.content)))
        elif isinstance(item, FunctionCallItem):
            name = item.name if item.namespace is None else qualified_name(item.namespace, item.name)
            _call_message(messages, pb.ToolCall(id=item.call_id, name=name, arguments=item.arguments))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(pb.ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
    return messages


def _function(tool: FunctionTool, param: str, namespace: NamespaceTool | None = None) -> pb.Tool:
    name, description = tool.name, tool.description or ""
    if namespace is not None:
        name = qualified_name(namespace.name, name)
        if namespace.description:
            description = f"({namespace.name}: {namespace.description}) {description}".strip()
    if namespace is not None and not TOOL_NAME.match(name):  # a function's own name: checked in protocol.py
        raise invalid(f"'{param}.name' must match ^[a-zA-Z0-9_-]{{1,64}}$, got {json.dumps(name)}.", f"{param}.name")
    schema = "" if tool.parameters is None else schema_text(tool.parameters)
    return pb.Tool(name=name, description=description, parameters_json=schema)


def offered_tools(tools: list[Sent], mcp: McpRun | None = None) -> Tools:
    """Functions, and the functions of namespaces, offered; web search left out; other types refused.
    An mcp tool's functions are those `mcp` (its run) offers: the server's tools."""
    out = Tools()
    for k, tool in enumerate(tools):
        if isinstance(tool, McpTool):
            out.mcp.append((k, tool))
            functions = [] if mcp is None else [f for f in mcp.offered()
                                                if mcp.functions[f.name].tool.server_label == tool.server_label]
            out.offered += functions
            out.paths += [f"tools[{k}]"] * len(functions)
            continue
        if isinstance(tool, HostedTool):
            out.not_offered.append(tool.type)
            continue
        if isinstance(tool, FileSearch):
            if out.file_search is not None:
                raise invalid("'tools' may hold one file_search tool (it searches several vector stores).",
                              f"tools[{k}]")
            out.file_search = tool
            out.offered.append(SEARCH_FUNCTION)
            out.paths.append(f"tools[{k}]")
            continue
        grouped = tool.tools if isinstance(tool, NamespaceTool) else [tool]
        for j, function in enumerate(grouped):
            param = f"tools[{k}].tools[{j}]" if isinstance(tool, NamespaceTool) else f"tools[{k}]"
            out.offered.append(_function(function, param, tool if isinstance(tool, NamespaceTool) else None))
            out.paths.append(param)
            if isinstance(tool, NamespaceTool):
                out.namespaced[out.offered[-1].name] = (tool.name, function.name)
    if len({t.name for t in out.offered}) < len(out.offered):
        raise invalid("'tools' names a function twice (a namespace's functions are named NAMESPACE__NAME).", "tools")
    return out


def chosen_tools(choice: Any, offered: list[pb.Tool], mcp: McpRun | None = None,
                 ) -> tuple[pb.ToolChoice, list[pb.Tool]]:
    """(the engine's tool choice, the tools offered): `allowed_tools` narrows the tools; an mcp choice forces
    the tool it names, or (no name) one of its server's tools."""
    if isinstance(choice, McpChoice):
        if mcp is None or choice.server_label not in mcp.servers:
            raise invalid(f"'tool_choice' names the MCP server '{choice.server_label}', which 'tools' has no "
                          f"mcp tool for.", "tool_choice.server_label")
        names = mcp.forced(choice.server_label, choice.name)
        if len(names) == 1:
            return tool_choice(None, names[0], offered), offered
        return tool_choice("required", None, [t for t in offered if t.name in names]), \
            [t for t in offered if t.name in names]
    if isinstance(choice, FileSearchChoice):
        if SEARCH_FUNCTION not in offered:
            raise invalid("'tool_choice' is file_search, but 'tools' holds no file_search tool.", "tool_choice")
        return tool_choice(None, SEARCH_FUNCTION.name, offered), offered
    if isinstance(choice, FunctionChoice):
        return tool_choice(None, choice.name, offered), offered
    if isinstance(choice, AllowedTools):
        wanted, names = {allowed.name for allowed in choice.tools}, {t.name for t in offered}
        if wanted - names:
            raise invalid(f"'tool_choice.tools' names tools not in 'tools': {', '.join(sorted(wanted - names))}.",
                          "tool_choice.tools")
        choice, offered = choice.mode, [t for t in offered if t.name in wanted]
    return tool_choice(choice, None, offered), offered


def constraint(request: ResponseRequest) -> pb.Constraint | None:
    fmt = request.text.format if request.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.schema_ is None:
        return pb.Constraint(json_object=True)
    return pb.Constraint(json_schema=schema_text(fmt.schema_))


def _chat(request: ResponseRequest, items: list[Sent], limits: RequestLimits,
          mcp: McpRun | None) -> tuple[pb.ChatInput, Tools]:
    messages = [] if request.instructions is None else [pb.ChatMessage(role="system", content=request.instructions)]
    messages += chat_messages(items)
    if len(messages) > limits.max_messages:
        raise invalid(f"'input' may hold at most {limits.max_messages} messages on this server, got {len(messages)}.",
                      "input")
    tools = offered_tools(request.tools or [], mcp)
    choice, tools.offered = chosen_tools(request.tool_choice, tools.offered, mcp)
    check_prompt_chars(chat_prompt_chars(messages, tools.offered), "input", limits)
    chat = pb.ChatInput(messages=messages, tools=tools.offered, tool_choice=choice,
                        parallel_tool_calls=request.parallel_tool_calls)
    reasoning_options(chat, request.reasoning and request.reasoning.effort, request.chat_template_kwargs)
    return chat, tools


def _echo(request: ResponseRequest) -> dict[str, Any]:
    """The request's settings as the response object repeats them (OpenAI's defaults where unset)."""
    reasoning, fmt = request.reasoning, request.text.format if request.text is not None else None
    choice = request.tool_choice
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata or {},
        "model": request.model,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_logprobs": request.top_logprobs or 0,
        "tool_choice": choice.as_sent() if isinstance(choice, Sent) else choice or "auto",
        "tools": [tool.as_sent() for tool in request.tools or []],
        "text": {"format": fmt.as_sent() if fmt is not None else {"type": "text"}},
        "truncation": request.truncation or "disabled",
        "user": request.user,
        "store": request.store is not False,
        "reasoning": {"effort": reasoning and reasoning.effort, "summary": reasoning and reasoning.summary},
        "background": False,
        "max_tool_calls": request.max_tool_calls,
        "service_tier": "default",
    }


def new_items(request: ResponseRequest) -> list[Sent]:
    return [MessageItem(role="user", content=request.input)] if isinstance(request.input, str) else request.input


def build_request(request: ResponseRequest, request_id: str, limits: RequestLimits,
                  inherited: list[dict[str, Any]] | None = None, mcp: McpRun | None = None) -> ResponsesRequest:
    """The engine request of a validated body. `inherited`: the context and output of `previous_response_id`;
    `mcp`: the run of its mcp tools, prepared (its prelude's items are the answer's first)."""
    new = new_items(request)
    context = inherited_items(inherited or []) + new
    produced = inherited_items(mcp.prelude) if mcp is not None else []
    chat, tools = _chat(request, context + produced, limits, mcp)
    logprobs = LOGPROBS_INCLUDE in (request.include or [])
    generate = pb.GenerateRequest(
        request_id=request_id, model=request.model, chat=chat, n=1, sampling=sampling_params(request),
        stopping=stopping_params(request, request.max_output_tokens or limits.max_tokens), logprobs=logprobs,
        top_logprobs=request.top_logprobs or 0 if logprobs else 0, drop_oldest_messages=request.truncation == "auto",
        max_reasoning_tokens=request.max_reasoning_tokens, constraint=constraint(request))
    stored = list(inherited or []) + [stored_item(item) for item in new]
    return ResponsesRequest(request.model, generate, stored, _echo(request), bool(request.stream),
                            request.store is not False, logprobs, tools, RESULTS_INCLUDE in (request.include or []),
                            request.max_tool_calls)
