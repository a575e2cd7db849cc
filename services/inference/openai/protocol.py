"""OpenAI's request models, and the bodies of its errors (pure: no FastAPI, no engine).

Every field of a request is honoured or refused with a 400 naming it, never silently
dropped (`check_fields`): OpenAI's fields this server does not implement (`suffix`,
`audio`, ...) are accepted only at the value that changes nothing, fields that
only label a request (`user`, `metadata`, ...) are accepted and ignored, the fields a logits
processor reads (`logit_bias`, the penalties, ...: `rlrun.inference.logits`) are left to it,
and a field nobody knows is refused, as OpenAI does.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from rlrun.common.errors import RequestError
from rlrun.inference.logits import request_fields
from rlrun.inference.params import MAX_TOP_LOGPROBS


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


LABELS = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})
"""OpenAI request fields that label a request without changing its output: ignored."""


def _one_shape_error(message: str):
    """A wrap validator for a field of several accepted shapes: one message for every wrong
    shape, instead of pydantic's one per member of the union."""

    def validate(cls, value, parse):
        try:
            return parse(value)
        except ValidationError as error:
            raise PydanticCustomError("shape", message) from error

    return validate


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = None
    schema_: Any = Field(None, alias="schema")
    """None: any JSON value."""


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(BaseModel):
    # Extra fields are kept, so that `check_fields` can name each one it refuses.
    model_config = ConfigDict(extra="allow")

    unsupported: ClassVar[dict[str, tuple[Any, ...]]]
    """OpenAI fields this server does not implement, each with the values that change
    nothing (accepted as if the field were absent)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    """vLLM's extension: tokens less likely than min_p times the most likely one are not drawn."""
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = []
    min_tokens: int = 0
    """vLLM's extension: no stop token is drawn, and no stop sequence ends a choice, before it
    has this many tokens."""
    seed: int | None = None
    # `logit_bias`, `presence_penalty`, `frequency_penalty`, vLLM's `repetition_penalty` and
    # any other field a logits processor reads (`rlrun.inference.logits`) arrive as extra
    # fields: their knobs read and check them.
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None

    def check_fields(self) -> None:
        """Refuses, naming it, each field that would be ignored while changing the answer."""
        knobs = request_fields()
        for name, value in (self.model_extra or {}).items():
            if name in LABELS or name in knobs:
                continue
            if name not in self.unsupported:
                raise RequestError(name, f"unrecognized request argument: {name}")
            if not self._changes_nothing(name, value):
                neutral = " or ".join(json.dumps(v) for v in self.unsupported[name] if v is not None)
                absent = f"leave it out or send {neutral}" if neutral else "leave it out"
                raise RequestError(name, f"{name} is not supported by this server; {absent}")

    def _changes_nothing(self, name: str, value: Any) -> bool:
        return value is None or value in self.unsupported[name]

    def samples_per_prompt(self) -> int:
        """How many samples the engine draws for each prompt."""
        return self.n

    def samples_field(self) -> str:
        """The field that set `samples_per_prompt`."""
        return "n"

    def max_tokens_field(self) -> str:
        """The field that sets the completion's length."""
        return "max_tokens"

    @abstractmethod
    def top_logprobs_count(self) -> int:
        """How many alternatives each position reports (0: none); a count over
        MAX_TOP_LOGPROBS is a 400 naming the field that asked for it."""


class CompletionRequest(SamplingFields):
    unsupported = {"suffix": (None, "")}

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    best_of: int | None = None
    """Samples drawn per prompt, of which the `n` best (`best_of_each`) are answered."""

    def samples_field(self) -> str:
        return "n" if self.best_of is None or self.best_of == self.n else "best_of"

    def samples_per_prompt(self) -> int:
        best_of = self.best_of
        if best_of is None or self.samples_field() == "n":
            return self.n
        if best_of < self.n:
            raise RequestError("best_of", f"best_of must be >= n ({self.n}), got {self.best_of}")
        if self.stream:
            raise RequestError(
                "best_of", "best_of > n cannot be streamed: the best are known only at the end"
            )
        return best_of

    def top_logprobs_count(self) -> int:
        """How many alternatives each position reports: `logprobs` (0 or unset: none)."""
        if self.logprobs is not None and self.logprobs > MAX_TOP_LOGPROBS:
            raise RequestError("logprobs", f"logprobs must be <= {MAX_TOP_LOGPROBS}, got {self.logprobs}")
        return self.logprobs or 0

    _prompt_shape = field_validator("prompt", mode="wrap")(
        _one_shape_error(
            "prompt must be a string, a list of token ids, or a batch: a list of strings "
            "or a list of token id lists"
        )
    )


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)


class ToolIn(BaseModel):
    """A tool the request offers: OpenAI's function tool, passed on to the chat template."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: FunctionIn


class CalledFunction(BaseModel):
    name: str = Field(min_length=1)
    arguments: str
    """A JSON object, as text."""

    @field_validator("arguments")
    @classmethod
    def _a_json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"arguments must be a JSON object: {error}") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must be a JSON object")
        return value


class ToolCallIn(BaseModel):
    """A call an earlier assistant message made."""

    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    function_call: dict | None = None

    _content_shape = field_validator("content", mode="wrap")(
        _one_shape_error("content must be a string or a list of content parts")
    )


ToolMode = Literal["none", "auto", "required", "named"]
"""How a chat's answers carry tool calls (`ChatCompletionRequest.tool_mode`)."""

_PLAIN_TOOL_CHOICES: dict[str, ToolMode] = {"auto": "auto", "none": "none", "required": "required"}
"""The `tool_choice` strings, each the mode it asks for (any other choice names a tool)."""


class ChatCompletionRequest(SamplingFields):
    unsupported = {
        "functions": (None, []),
        "function_call": (None, "none"),
        "modalities": (None, ["text"]),
        "audio": (None,),
        "prediction": (None,),
        "reasoning_effort": (None,),
        "web_search_options": (None,),
    }

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[ToolIn] | None = None
    tool_choice: str | dict | None = None
    """"auto" (the default with tools): the answer's tool calls are parsed out of its text;
    "none": they are not; "required" or {"type": "function", "function": {"name": ...}}: the
    answer is constrained to calls (of any tool offered, or of the named one)."""
    parallel_tool_calls: bool | None = None
    """False keeps only a choice's first call."""

    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def tool_mode(self) -> ToolMode:
        """How the answers carry tool calls; a `tool_choice` this server cannot keep is a 400."""
        choice = self.tool_choice
        if choice is not None and not self.tools:
            raise RequestError("tool_choice", "tool_choice needs tools")
        if choice is None:
            return "auto" if self.tools else "none"
        if isinstance(choice, str) and choice in _PLAIN_TOOL_CHOICES:
            return _PLAIN_TOOL_CHOICES[choice]
        self.named_tool()
        return "named"

    def named_tool(self) -> ToolIn:
        """The tool a named `tool_choice` forces."""
        choice = self.tool_choice
        name = None
        if isinstance(choice, dict) and choice.get("type") == "function":
            function = choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise RequestError(
                "tool_choice",
                f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                f'"function": {{"name": ...}}}}, got {json.dumps(choice)}',
            )
        for tool in self.tools or ():
            if tool.function.name == name:
                return tool
        offered = ", ".join(tool.function.name for tool in self.tools or ())
        raise RequestError(
            "tool_choice.function.name", f"tool_choice names {name!r}, not a tool offered ({offered})"
        )

    def forced_name(self) -> str | None:
        """With a named tool_choice, the function every call is of; None: the calls (of
        tool_choice "required") name theirs."""
        return self.named_tool().function.name if self.tool_mode() == "named" else None

    def offered_tools(self) -> list[dict]:
        """The tools offered, in OpenAI's shape (a tool-call parser reads their parameters)."""
        return [tool.model_dump() for tool in self.tools or ()]

    def tool_call_limit(self) -> int | None:
        return 1 if self.parallel_tool_calls is False else None

    def top_logprobs_count(self) -> int:
        """How many alternatives each position reports: `top_logprobs`, which needs `logprobs`."""
        if not self.top_logprobs:
            return 0
        if not self.logprobs:
            raise RequestError("logprobs", "top_logprobs needs logprobs = true")
        if self.top_logprobs > MAX_TOP_LOGPROBS:
            raise RequestError(
                "top_logprobs", f"top_logprobs must be <= {MAX_TOP_LOGPROBS}, got {self.top_logprobs}"
            )
        return self.top_logprobs


class ModelNotFound(Exception):
    """A request for a model this server does not serve (404 `model_not_found`)."""

    def __init__(self, model: str, served: str):
        super().__init__(model)
        self.model = model
        self.served = served


def model_not_found(model: str, served: str) -> dict:
    """OpenAI's 404 body for a model this server does not serve."""
    return error_body(
        f"The model `{model}` does not exist or you do not have access to it. This server serves {served!r}.",
        "model",
        code="model_not_found",
    )


def error_body(
    message: str, param: str | None, error_type: str = "invalid_request_error", code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
