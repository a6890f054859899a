"""The six definition document kinds, as the YAML author writes them (`Eval`: `eval_documents`).

These pydantic models are the edge: they reject unknown fields and wrong
types, and they normalize (defaults filled in, aliases mapped to one
spelling) so that two documents that mean the same thing dump to the same
spec. They know nothing of other documents or of files: references and paths
are the compiler's job.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from . import templates
from .schemas import schema_field

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
# A Tool's name may use capitals, so a tool can be called `Bash` as Claude Code's is (hook scripts
# check `tool_name == "Bash"`); Tool names are unique regardless of case (see `linking`).
TOOL_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}"
ToolName = Annotated[str, StringConstraints(pattern=f"^{TOOL_NAME}$")]
TOOL_REF = re.compile(rf"{TOOL_NAME}(/[A-Za-z0-9._-]{{1,128}})?")  # an agent's `tools:` entry
Seconds = Annotated[float, Field(gt=0, le=86_400)]
KINDS = ("Agent", "Model", "Tool", "MCPServer", "Hook", "Skill")

HOOK_EVENTS = {
    "SessionStart": "session_start",
    "UserPromptSubmit": "user_prompt_submit",
    "PreToolUse": "pre_tool_use",
    "PostToolUse": "post_tool_use",
    "Stop": "stop",
}
FAIL_CLOSED_EVENTS = {"pre_tool_use", "user_prompt_submit"}
PROVIDER_DEFAULTS = {
    "openai": ("https://api.openai.com/v1", "${OPENAI_API_KEY}"),
    "anthropic": ("https://api.anthropic.com", "${ANTHROPIC_API_KEY}"),
    "scripted": (None, None),
}


class FieldProblem(ValueError):
    """A check across fields that can still point at the offending one.

    Raised from a model validator, whose error pydantic locates at the whole
    model; `path` (below that model) lets the compiler report the field itself.
    """

    def __init__(self, path: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.path = path


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Document(Strict):
    kind: str
    name: Name
    description: str = Field(default="", max_length=4096)


def _check_regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern


def _check_template(text: str) -> str:
    try:
        templates.placeholders(text)
    except templates.TemplateSyntaxError as exc:
        raise ValueError(str(exc)) from None
    return text


def _check_secret(text: str | None) -> str | None:
    if text is not None and not templates.is_secret_reference(text):
        raise ValueError("write secrets as ${ENV_VAR} references, never as literal values")
    return text


# --- Model -----------------------------------------------------------------


class ToolCall(Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptRule(Strict):
    when: Annotated[str, Field(min_length=1)] | None = None
    reply: str | None = None
    tool_call: ToolCall | None = None

    _when = field_validator("when")(lambda cls, v: v if v is None else _check_regex(v))

    @model_validator(mode="after")
    def _reply_default(self) -> ScriptRule:
        if self.reply is None:
            if self.tool_call is None:
                raise ValueError("a rule needs a reply, a tool_call, or both")
            object.__setattr__(self, "reply", "{tool_result}")
        return self


class ModelDocument(Document):
    kind: Literal["Model"]
    provider: Literal["openai", "anthropic", "scripted"]
    model: str = ""
    base_url: str | None = None
    api_key: str | None = None
    context_window: int | None = Field(default=None, gt=0)
    max_output_tokens: int = Field(default=4096, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    timeout_s: Seconds = 60.0
    retries: int = Field(default=2, ge=0, le=10)
    fallbacks: tuple[Name, ...] = ()
    script: tuple[ScriptRule, ...] = ()
    default: str | None = None

    _api_key = field_validator("api_key")(lambda cls, v: _check_secret(v))

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _provider_rules(self) -> ModelDocument:
        base_url, api_key = PROVIDER_DEFAULTS[self.provider]
        if self.provider == "scripted":
            for name in ("base_url", "api_key"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} does not apply to the scripted provider")
        else:
            if not self.model:
                raise ValueError(f"provider {self.provider} needs `model`")
            if self.script or self.default is not None:
                raise ValueError("script and default apply only to the scripted provider")
            object.__setattr__(self, "base_url", self.base_url or base_url)
            object.__setattr__(self, "api_key", self.api_key or api_key)
        if self.name in self.fallbacks:
            raise FieldProblem(("fallbacks", self.fallbacks.index(self.name)),
                               "a model cannot fall back to itself")
        if self.context_window is not None and self.context_window <= self.max_output_tokens:
            # every request would fail with context_window_exceeded: no room is left for its input
            raise FieldProblem(("context_window",), f"a context window of {self.context_window} tokens"
                               f" cannot hold max_output_tokens ({self.max_output_tokens}) and a request")
        return self


# --- Tool ------------------------------------------------------------------


class HttpAction(Strict):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = None
    timeout_s: Seconds = 30.0

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://", v):
            raise ValueError("must start with http:// or https://")
        return _check_template(v)


class CommandAction(Strict):
    argv: tuple[str, ...] = Field(min_length=1)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: Seconds = 30.0

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for item in v:
            _check_template(item)
        if not v[0]:
            raise ValueError("argv[0] must name a program")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in v if name.upper().startswith("CORRAL_"))
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: CORRAL_* names are reserved for Corral's own settings")
        return v


class A2AAction(Strict):
    """A remote A2A agent as a tool: its card's URL (or the agent's base URL), headers (`${VAR}` secrets)."""

    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: Seconds = 120.0

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v


A2A_INPUT_SCHEMA = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}


class ToolDocument(Document):
    kind: Literal["Tool"]
    name: ToolName
    input_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    http: HttpAction | None = None
    command: CommandAction | None = None
    a2a: A2AAction | None = None  # one SendMessage per call to a remote A2A agent (§14)
    permission: Literal["allow", "ask", "deny"] = "allow"
    # May a call whose outcome a crash left unknown run again? Only the author knows (§9).
    replay: Literal["safe", "unsafe"] = "unsafe"

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        schema_field(v)
        if v.get("type") != "object":
            raise ValueError('the root of input_schema must be {"type": "object", ...}')
        return v

    @model_validator(mode="after")
    def _one_action(self) -> ToolDocument:
        if [self.http, self.command, self.a2a].count(None) != 2:
            raise ValueError("a tool needs exactly one of `http`, `command` or `a2a`")
        if self.a2a is not None and "input_schema" not in self.model_fields_set:
            object.__setattr__(self, "input_schema", dict(A2A_INPUT_SCHEMA))  # {"message": string}
        known = set(self.input_schema.get("properties", {}))
        for path, text in self.template_fields():
            for name in templates.placeholders(text):
                if name not in known:
                    raise FieldProblem(path, f"placeholder {{{name}}} is not a property of input_schema")
        return self

    def template_fields(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Every string that may hold placeholders, with its path in the document."""
        if self.command is not None:
            return [(("command", "argv", i), item) for i, item in enumerate(self.command.argv)]
        if self.a2a is not None:
            return []  # no placeholders: the arguments are the message
        assert self.http is not None
        headers = [(("http", "headers", k), v) for k, v in self.http.headers.items()]
        return [(("http", "url"), self.http.url), *headers, *_strings(self.http.body, ("http", "body"))]


def _strings(value: Any, path: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], str]]:
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, (*path, k))]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _strings(v, (*path, i))]
    return []


# --- MCPServer -------------------------------------------------------------


class ToolFilter(Strict):
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()


class MCPServerDocument(Document):
    kind: Literal["MCPServer"]
    transport: Literal["stdio", "http"] | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: ToolFilter = Field(default_factory=ToolFilter)
    timeout_s: Seconds = 30.0

    @model_validator(mode="after")
    def _transport(self) -> MCPServerDocument:
        transport = self.transport or ("http" if self.url else "stdio")
        object.__setattr__(self, "transport", transport)
        if transport == "stdio":
            if not self.command:
                raise ValueError("transport stdio needs `command`")
            if self.url or self.headers:
                raise ValueError("url and headers apply only to transport http")
        else:
            if not self.url or not re.match(r"^https?://", self.url):
                raise ValueError("transport http needs an http(s) `url`")
            if self.command or self.args or self.env or self.cwd:
                raise ValueError("command, args, env and cwd apply only to transport stdio")
        return self


# --- Hook ------------------------------------------------------------------


class HookHttp(Strict):
    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://", v):
            raise ValueError("must start with http:// or https://")
        return v


class HookDocument(Document):
    kind: Literal["Hook"]
    event: Literal["session_start", "user_prompt_submit", "pre_tool_use", "post_tool_use", "stop"]
    matcher: str = ""
    command: tuple[str, ...] | None = None
    http: HookHttp | None = None
    timeout_s: Seconds = 60.0
    on_error: Literal["allow", "deny"] | None = None

    @field_validator("event", mode="before")
    @classmethod
    def _event(cls, v: Any) -> Any:
        return HOOK_EVENTS.get(v, v) if isinstance(v, str) else v

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("matcher")
    @classmethod
    def _matcher(cls, v: str) -> str:
        v = "" if v.strip() in ("", "*") else v
        if v and not re.fullmatch(r"[A-Za-z0-9_|-]+", v):
            _check_regex(v)
        return v

    @model_validator(mode="after")
    def _handler(self) -> HookDocument:
        if (self.command is None) == (self.http is None):
            raise ValueError("a hook needs exactly one of `command` or `http`")
        if self.command is not None and (not self.command or not self.command[0]):
            raise ValueError("command must name a program")
        if self.on_error is None:
            default = "deny" if self.event in FAIL_CLOSED_EVENTS else "allow"
            object.__setattr__(self, "on_error", default)
        return self


# --- Skill and Agent -------------------------------------------------------


class SkillDocument(Document):
    kind: Literal["Skill"]
    instructions: str | None = None
    path: str | None = None
    license: str | None = None
    compatibility: str | None = Field(default=None, max_length=500)
    metadata: dict[str, str] = Field(default_factory=dict)
    allowed_tools: str | None = Field(default=None, alias="allowed-tools")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _body(self) -> SkillDocument:
        if self.instructions is None and self.path is None:
            raise ValueError("a skill needs `instructions` or `path`")
        return self


class Budget(Strict):
    """Tokens (input + output, as the provider reports them, else estimated) an agent may spend."""

    max_tokens_per_turn: int | None = Field(default=None, gt=0, strict=True)
    max_tokens_per_conversation: int | None = Field(default=None, gt=0, strict=True)


class ContextPolicy(Strict):
    """How an agent's conversation is kept inside its model's context window (contract §10)."""

    strategy: Literal["summarize", "truncate", "none"] = "summarize"
    threshold: float = Field(default=0.8, gt=0, le=1)  # of the model's context_window
    keep_recent_turns: int = Field(default=2, ge=0, le=1000, strict=True)  # before the running one
    model: Name | None = None  # the Model that writes summaries; None: the agent's


class AgentDocument(Document):
    kind: Literal["Agent"]
    model: Name
    instructions: str = ""
    instructions_file: str | None = None
    tools: tuple[str, ...] = ()
    agents: tuple[Name, ...] = ()
    skills: tuple[Name, ...] = ()
    hooks: tuple[Name, ...] = ()
    max_steps: int = Field(default=10, ge=1, le=1000)
    on_busy: Literal["reject", "enqueue", "interrupt", "steer"] = "reject"
    # Added after digests were pinned: absent (None) is left out of the spec (see `normalize`).
    budget: Budget | None = None
    output_schema: dict[str, Any] | None = None
    # Added after digests were pinned: the default policy is left out of the spec (see `normalize`).
    context: ContextPolicy = Field(default_factory=ContextPolicy)

    @field_validator("output_schema")
    @classmethod
    def _output_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return v if v is None else schema_field(v)

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for ref in v:
            if not TOOL_REF.fullmatch(ref):
                raise ValueError(f"{ref!r} is not a tool name, server name or server/tool")
        return v

    @model_validator(mode="after")
    def _one_instructions(self) -> AgentDocument:
        if self.instructions and self.instructions_file:
            raise ValueError("give `instructions` or `instructions_file`, not both")
        if self.name in self.agents:
            raise FieldProblem(("agents", self.agents.index(self.name)),
                               "an agent cannot call itself as a sub-agent")
        return self


DOCUMENT_MODELS: dict[str, type[Document]] = {
    "Agent": AgentDocument,
    "Model": ModelDocument,
    "Tool": ToolDocument,
    "MCPServer": MCPServerDocument,
    "Hook": HookDocument,
    "Skill": SkillDocument,
}


def json_schema(models: dict[str, type[Document]] | None = None) -> dict[str, Any]:
    """One JSON Schema for any definition document, for editors.

    It branches on `kind` (`if`/`then`), not `oneOf`: with `oneOf` a misspelled field fails every
    branch and a validator can only say "not valid under any of the given schemas"; here the one
    branch of the document's kind reports the field by name.
    """
    models = DOCUMENT_MODELS if models is None else models
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Corral definition document",
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"enum": list(models)}},
        "allOf": [],
        "$defs": {},
    }
    for kind, model in models.items():
        sub = model.model_json_schema(ref_template="#/$defs/{model}", mode="validation")
        schema["$defs"].update(sub.pop("$defs", {}))
        if kind == "Hook":
            sub["properties"]["event"]["enum"] += list(HOOK_EVENTS)
            sub["properties"]["command"] = {
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
            }
        schema["$defs"][model.__name__] = sub
        schema["allOf"].append({"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                                "then": {"$ref": f"#/$defs/{model.__name__}"}})
    return schema
