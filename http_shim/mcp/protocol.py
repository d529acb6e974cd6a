"""The `mcp` tool of /v1/responses, its tool choice and its items, typed as the openai SDK types them
(openai.types.responses: tool.Mcp, ToolChoiceMcp, McpListTools, McpCall, McpApprovalRequest,
McpApprovalResponse). The tool's `headers` and `authorization` are secrets: `as_sent` (what the response
echoes and the store keeps) leaves them out."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainValidator, ValidationInfo, WithJsonSchema, model_validator

from ..protocol.base import ApiModel, Bool, NonEmptyStr, Sent, Str, fail, got, one_of


SECRET_FIELDS = ("headers", "authorization")


class ToolNames(ApiModel):
    """`{"tool_names": [...], "read_only": bool}`: a filter of a server's tools."""

    tool_names: list[Str] | None = None
    read_only: Bool | None = None


class ApprovalFilter(ApiModel):
    always: ToolNames | None = None
    never: ToolNames | None = None


def _allowed_tools(value: Any, info: ValidationInfo) -> list[str] | ToolNames:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, dict):
        return ToolNames.model_validate(value, context=info.context)
    raise fail("'{param}' must be an array of tool names or {{\"tool_names\": [...]}}, got {got}.", got=got(value))


def _require_approval(value: Any, info: ValidationInfo) -> str | ApprovalFilter:
    if value in ("always", "never"):
        return value
    if isinstance(value, dict):
        return ApprovalFilter.model_validate(value, context=info.context)
    raise fail("'{param}' must be 'always', 'never' or {{\"always\": {{...}}, \"never\": {{...}}}}, got {got}.",
               got=got(value))


AllowedToolsField = Annotated[Any, PlainValidator(_allowed_tools), WithJsonSchema({"oneOf": [
    {"type": "array", "items": {"type": "string"}}, {"type": "object"}]})]
RequireApprovalField = Annotated[Any, PlainValidator(_require_approval), WithJsonSchema({"oneOf": [
    {"type": "string", "enum": ["always", "never"]}, {"type": "object"}]})]


class McpTool(Sent):
    type: one_of("mcp")
    server_label: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    server_url: NonEmptyStr | None = None
    server_description: Str | None = None
    headers: dict[str, Str] | None = None
    authorization: Str | None = None
    allowed_tools: AllowedToolsField | None = None
    require_approval: RequireApprovalField | None = None
    connector_id: Str | None = None

    @model_validator(mode="after")
    def _url(self) -> McpTool:
        if self.server_url is None:
            raise fail("'{param}.server_url' is required: this server reaches MCP servers by URL only "
                       "(connectors are not served).", field="server_url")
        return self

    def as_sent(self) -> dict[str, Any]:
        return {k: v for k, v in super().as_sent().items() if k not in SECRET_FIELDS}

    def allows(self, name: str, annotations: dict[str, Any] | None) -> bool:
        """Whether `allowed_tools` lets the model have this tool."""
        allowed = self.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, list):
            return name in allowed
        return _matches(allowed, name, annotations) is not False

    def needs_approval(self, name: str, annotations: dict[str, Any] | None) -> bool:
        """OpenAI's rule: approval unless `never` (or a `never` filter that names the tool)."""
        policy = self.require_approval
        if policy is None or policy == "always":
            return True
        if policy == "never":
            return False
        if policy.never is not None and _matches(policy.never, name, annotations):
            return False
        return True


def _matches(names: ToolNames, name: str, annotations: dict[str, Any] | None) -> bool | None:
    """Whether a filter names the tool (None: the filter is empty)."""
    checks = []
    if names.tool_names is not None:
        checks.append(name in names.tool_names)
    if names.read_only is not None:
        checks.append(bool((annotations or {}).get("readOnlyHint")) == names.read_only)
    return all(checks) if checks else None


class McpChoice(Sent):
    """Forces a tool of one server (`name`), or any of its tools."""

    type: one_of("mcp")
    server_label: NonEmptyStr
    name: Str | None = None


class McpListToolsItem(Sent):
    """An earlier listing, given back: the server's tools are taken from it, not listed again."""

    type: one_of("mcp_list_tools")
    server_label: Str
    tools: list[dict[str, Any]] = []
    error: Str | None = None


class McpCallItem(Sent):
    type: one_of("mcp_call")
    server_label: Str
    name: Str
    arguments: Str = "{}"
    output: Str | None = None
    error: Any = None


class McpApprovalRequestItem(Sent):
    type: one_of("mcp_approval_request")
    id: NonEmptyStr
    server_label: Str
    name: Str
    arguments: Str = "{}"


class McpApprovalResponseItem(Sent):
    type: one_of("mcp_approval_response")
    approval_request_id: NonEmptyStr
    approve: Bool
    reason: Str | None = None


MCP_ITEMS = {"mcp_list_tools": McpListToolsItem, "mcp_call": McpCallItem,
             "mcp_approval_request": McpApprovalRequestItem, "mcp_approval_response": McpApprovalResponseItem}
