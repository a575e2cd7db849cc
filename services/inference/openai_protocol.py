"""OpenAI-compatible request models and response bodies (pure: no FastAPI, no engine).

A completion's `prompt` is a string, a list of token ids, or a batch of either; choice
`i * n + j` of the answer is sample j of prompt i, as in OpenAI's API. With `best_of` > n,
`best_of` samples are drawn per prompt and the n with the highest logprob per token are
answered, best first (not streamed; `usage` counts the answered ones, as vLLM does).

`logit_bias` (token id -> bias), `presence_penalty` and `frequency_penalty` change the logits
before temperature, as OpenAI defines them: the penalties count the tokens the choice has
generated so far, not its prompt. vLLM's `repetition_penalty` also covers the prompt.

Logprobs (`logprobs` of a completion, `logprobs` / `top_logprobs` of a chat) are under the
distribution sampled from, softmax(logits' / T) with logits' the biased and penalised
logits (without bias and penalties, the distribution the trainer recomputes); at most
MAX_TOP_LOGPROBS alternatives per position.

`echo` repeats each prompt before its completion, with the prompt tokens' logprobs under the
model's own distribution (temperature 1; the first token has none), as OpenAI and vLLM do;
with `max_tokens` 0 nothing is generated. This is how harnesses score loglikelihoods. A
stream sends each choice's prompt as its first chunk.

A choice's text ends before its first `stop` sequence (finish_reason "stop"); its tokens and
logprobs run up to the token that completed it. The engine stops on single-token sequences
itself; longer ones are found in the text as it streams, and the request is cancelled once
every choice has stopped.

Chat `tools` are offered to the model through its tokenizer (`render_chat`), and the tool
calls an answer writes (Hermes format, `rlrun.inference.tool_calls`) come back as
`tool_calls` with `tool_choice` "auto" (the default); "none" leaves them in the text.
`tool_choice` "required" or a named function constrains the answer to JSON
(`rlrun.inference.structured`), as vLLM does: a non-empty array of {"name", "parameters"}
objects, one per call, of the tools offered ("required"; one at most with
`parallel_tool_calls` false), or the named function's arguments object; it comes back as
`tool_calls` (finish_reason "tool_calls"), or as content if `max_tokens` cut it short.

`response_format` {"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}} constrains a choice's text to a JSON object or to a value matching the schema
(chat and completions, as in vLLM). A schema llguidance cannot compile is a 400 naming it.

Every field of a request is honoured or refused with a 400 naming it, never silently
dropped (`check_fields`): OpenAI's fields this server does not implement (`suffix`,
`audio`, ...) are accepted only at the value that changes nothing, fields that
only label a request (`user`, `metadata`, ...) are accepted and ignored, and a field OpenAI
does not know is refused, as OpenAI does. `top_k`, `min_p`, `stop_token_ids`,
`repetition_penalty` and `min_tokens` are accepted as vLLM-style extensions. One model is served: a
`model` other than its id is a 404 with code `model_not_found`, as OpenAI answers it (an absent
`model` means the one served).

A prompt that leaves no room for a token, or whose `max_tokens` runs past the context, is a 400
with code `context_length_exceeded` and OpenAI's wording ("This model's maximum context length
is ..."), which clients such as litellm recognise.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from rlrun.common.errors import RequestError
from rlrun.common.hermes import calls_text
from rlrun.common.tokenizer import ChatMessage, Tokenizer, render_chat
from rlrun.inference.engines.base import Completion, TopLogprobs
from rlrun.inference.logits import Grammar, RequestFields, read_knobs, request_fields
from rlrun.inference.params import MAX_TOP_LOGPROBS, GenerationParams
from rlrun.inference.structured import schema_text
from rlrun.inference.tool_calls import forced_tool_calls, split_tool_calls


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


StructuredOutput = tuple[str, str]
"""(the request field that asked for it, the JSON schema as text)."""


class _SamplingFields(BaseModel):
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

    def structured_output(self) -> StructuredOutput | None:
        """The JSON schema every choice must match (the `json_schema` knob), and the field
        that asked for it; None when the text is free."""
        form = self.response_format
        if form is None or form.type == "text":
            return None
        if form.type == "json_object":
            return "response_format", schema_text({"type": "object"}, "response_format")
        if form.json_schema is None:
            raise RequestError("response_format.json_schema", 'type "json_schema" needs a json_schema')
        schema = {} if form.json_schema.schema_ is None else form.json_schema.schema_
        field = "response_format.json_schema.schema"
        return "response_format", schema_text(schema, field)

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


class CompletionRequest(_SamplingFields):
    unsupported = {"suffix": (None, "")}

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    best_of: int | None = None
    """Samples drawn per prompt, of which the `n` best (`best_of_each`) are answered."""

    def samples_field(self) -> str:
        return "n" if self.best_of is None or self.best_of == self.n else "best_of"

    def samples_per_prompt(self) -> int:
        if self.samples_field() == "n":
            return self.n
        if self.best_of < self.n:
            raise RequestError("best_of", f"best_of must be >= n ({self.n}), got {self.best_of}")
        if self.stream:
            raise RequestError(
                "best_of", "best_of > n cannot be streamed: the best are known only at the end"
            )
        return self.best_of

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


class ChatCompletionRequest(_SamplingFields):
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

    def tool_mode(self) -> Literal["none", "auto", "required", "named"]:
        """How the answers carry tool calls; a `tool_choice` this server cannot keep is a 400."""
        choice = self.tool_choice
        if choice is not None and not self.tools:
            raise RequestError("tool_choice", "tool_choice needs tools")
        if choice is None:
            return "auto" if self.tools else "none"
        if choice in ("auto", "none", "required"):
            return choice
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

    def structured_output(self) -> StructuredOutput | None:
        mode = self.tool_mode()
        if mode not in ("required", "named"):
            return super().structured_output()
        if self.response_format is not None and self.response_format.type != "text":
            raise RequestError(
                "response_format", f'response_format cannot be combined with tool_choice "{mode}"'
            )
        if mode == "named":
            index = self.tools.index(self.named_tool())
            field = f"tools[{index}].function.parameters"
            return "tool_choice", schema_text(_parameters(self.tools[index]), field)
        calls = {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "enum": [tool.function.name]},
                            "parameters": _parameters(tool),
                        },
                        "required": ["name", "parameters"],
                        "additionalProperties": False,
                    }
                    for tool in self.tools
                ]
            },
        }
        if self.parallel_tool_calls is False:
            calls["maxItems"] = 1
        return "tool_choice", schema_text(calls, "tools")

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


def _parameters(tool: ToolIn) -> dict | bool:
    """The JSON schema of a tool's arguments (an object of any fields when it has none)."""
    parameters = (tool.function.model_extra or {}).get("parameters")
    return {"type": "object"} if parameters is None else parameters


def stop_strings(request: _SamplingFields) -> list[str]:
    """The request's `stop` sequences: the text of a choice ends before the first of them."""
    strings = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    for i, text in enumerate(strings):
        if not text:
            raise RequestError(f"stop[{i}]", f"stop[{i}] must not be empty")
    return strings


def text_stop_strings(request: _SamplingFields, tokenizer: Tokenizer) -> list[str]:
    """The stop sequences only the text can show: those of more than one token (the engine
    stops on single-token ones itself), or all of them with `min_tokens`, since vLLM lets a
    single-token stop sequence be drawn before min_tokens (it only does not end the choice
    there), while the engine masks its stop tokens out."""
    if request.min_tokens:
        return stop_strings(request)
    return [text for text in stop_strings(request) if len(tokenizer.encode(text)) != 1]


def _stop_token_ids(request: _SamplingFields, tokenizer: Tokenizer) -> list[int]:
    stops = list(tokenizer.stop_token_ids) + list(request.stop_token_ids)
    if not request.min_tokens:
        for text in stop_strings(request):
            ids = tokenizer.encode(text)
            if len(ids) == 1:
                stops.append(ids[0])
    return sorted(set(stops))


def first_stop(text: str, stops: Sequence[str], start: int = 0, after: int = 0) -> int | None:
    """Where the earliest stop sequence in text[start:] that ends past text[:after] begins;
    None when there is none."""
    found = [at for at in (text.find(stop, max(start, after - len(stop) + 1)) for stop in stops) if at >= 0]
    return min(found) if found else None


def min_tokens_text(tokenizer: Tokenizer, token_ids: Sequence[int], min_tokens: int) -> int | None:
    """How many characters of text the first `min_tokens` tokens make, where a stop sequence
    may not end; None while there are fewer tokens than that (no stop sequence counts yet)."""
    if len(token_ids) < min_tokens:
        return None
    return len(tokenizer.decode(token_ids[:min_tokens])) if min_tokens else 0


def visible_text(
    tokenizer: Tokenizer, token_ids: Sequence[int], stops: Sequence[str], min_tokens: int = 0
) -> tuple[str, bool]:
    """A choice's text, ending before its first stop sequence (one that ends past its first
    `min_tokens` tokens), and whether one was found."""
    text = tokenizer.decode(token_ids)
    after = min_tokens_text(tokenizer, token_ids, min_tokens)
    cut = None if after is None else first_stop(text, stops, after=after)
    return (text, False) if cut is None else (text[:cut], True)


def sampling_params(
    request: _SamplingFields,
    tokenizer: Tokenizer,
    prompt_len: int,
    max_model_len: int,
    max_tokens: int | None,
    json_schema: str | None = None,
) -> GenerationParams:
    """The engine's settings for a request; `max_tokens` None means the rest of the context;
    `json_schema`: the request's `structured_output`, checked once per request by the caller."""
    if request.top_k < 0:
        raise RequestError("top_k", f"top_k must be >= 0, got {request.top_k}")
    knobs = read_knobs(RequestFields(dict(request)))
    if json_schema is not None:
        knobs[Grammar.name] = json_schema
    return GenerationParams(
        max_tokens=max_tokens if max_tokens is not None else max_model_len - prompt_len,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        min_p=request.min_p,
        stop_token_ids=_stop_token_ids(request, tokenizer),
        seed=request.seed,
        n=request.samples_per_prompt(),
        top_logprobs=request.top_logprobs_count(),
        knobs=knobs,
    )


Prompts = list[tuple[str, list[int]]]
"""The prompts of one request, each with the name of its field (for the 400 that names it)."""


def completion_prompts(request: CompletionRequest, tokenizer: Tokenizer) -> Prompts:
    prompt = request.prompt
    if isinstance(prompt, str):
        return [("prompt", tokenizer.encode(prompt))]
    if not prompt or isinstance(prompt[0], int):
        return [("prompt", list(prompt))]
    return [
        (f"prompt[{i}]", tokenizer.encode(item) if isinstance(item, str) else list(item))
        for i, item in enumerate(prompt)
    ]


def chat_prompts(request: ChatCompletionRequest, tokenizer: Tokenizer) -> Prompts:
    """The conversation rendered by the tokenizer's chat template, with the request's tools:
    always one prompt. Earlier tool calls are written as the model writes them (Hermes)."""
    request.tool_mode()  # refuses a tool_choice it cannot keep before anything runs
    messages = []
    for i, message in enumerate(request.messages):
        if message.function_call:
            raise RequestError(
                f"messages[{i}].function_call",
                "function_call is not supported by this server; use tool_calls",
            )
        content = message.content or ""
        if not isinstance(content, str):
            content = "".join(
                _text_part(part, f"messages[{i}].content[{j}]") for j, part in enumerate(content)
            )
        if message.tool_calls:
            if message.role != "assistant":
                raise RequestError(f"messages[{i}].tool_calls", "only assistant messages carry tool_calls")
            calls = calls_text([call.model_dump() for call in message.tool_calls])
            content = f"{content}\n{calls}" if content else calls
        messages.append(ChatMessage("system" if message.role == "developer" else message.role, content))
    tools = [tool.model_dump() for tool in request.tools or ()]
    try:
        return [("messages", render_chat(tokenizer, messages, add_generation_prompt=True, tools=tools))]
    except ValueError as error:
        raise RequestError("messages", str(error)) from error


def _text_part(part: ContentPart, where: str) -> str:
    if part.type != "text":
        raise RequestError(f"{where}.type", f"only text content parts are supported, got {part.type!r}")
    if part.text is None:
        raise RequestError(f"{where}.text", "a text content part needs its text")
    return part.text


class TextStream:
    """Incremental detokenization of one sample: the text each new batch of tokens adds, up
    to the first stop sequence that ends past its first `min_tokens` tokens (then `stopped`).
    Holds back a trailing U+FFFD, the mark of a multi-byte character not yet complete, and
    the tail that could still begin a stop sequence; `finish` releases that tail once the
    sample has ended otherwise."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.min_tokens = min_tokens
        self._after: int | None = None
        """`min_tokens_text` once the sample has min_tokens tokens (it does not change then)."""
        self.token_ids: list[int] = []
        self.emitted = ""
        self.stopped = False
        self._hold = max((len(stop) for stop in self.stops), default=1) - 1
        self._searched = 0

    def push(self, token_ids: Sequence[int]) -> str:
        if self.stopped:
            return ""
        self.token_ids += token_ids
        text = self.tokenizer.decode(self.token_ids)
        if text.endswith("\ufffd"):
            return ""
        if self._after is None:
            self._after = min_tokens_text(self.tokenizer, self.token_ids, self.min_tokens)
        cut = None
        if self._after is not None:
            cut = first_stop(text, self.stops, max(0, self._searched - self._hold), self._after)
        if cut is not None:
            self.stopped = True
            end = cut
        else:
            self._searched = len(text)
            end = len(text) - self._hold
        return self._emit(text, end)

    def finish(self) -> str:
        """The held-back tail, once the sample has ended without a stop sequence."""
        if self.stopped:
            return ""
        return self._emit(self.tokenizer.decode(self.token_ids), None)

    def _emit(self, text: str, end: int | None) -> str:
        start = len(self.emitted)
        if end is not None and end <= start:
            return ""
        self.emitted = text[:end]
        return self.emitted[start:]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def _token_text(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


LOWEST_LOGPROB = -9999.0
"""What an alternative that min_p/top_k/top_p truncated away reports: its logprob is -inf,
which JSON cannot carry (vLLM reports the same)."""


def _json_logprob(value: float) -> float:
    return max(value, LOWEST_LOGPROB)


@dataclass
class Echo:
    """A prompt repeated before its completion (`echo`): its tokens, each one's logprob (None
    for the first, which has no context) and with top_logprobs, each position's most likely
    tokens (None for the first)."""

    token_ids: list[int]
    logprobs: list[float | None]
    top: list[TopLogprobs | None] | None


def completion_logprobs(
    tokenizer: Tokenizer,
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top: Sequence[TopLogprobs | None] | None,
    text_offset: int = 0,
) -> dict:
    """A completion choice's `logprobs`: each token's text and logprob, and with `top`, a
    {text: logprob} map of each position's most likely tokens (None where a position has no
    logprob: an echoed prompt's first token). `text_offset`: the characters of the choice
    before these tokens (a stream's earlier chunks)."""
    tokens = [_token_text(tokenizer, t) for t in token_ids]
    top_maps = None
    if top is not None:
        top_maps = [
            None
            if position is None
            else {_token_text(tokenizer, t): _json_logprob(value) for t, value in position}
            for position in top
        ]
    return {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "top_logprobs": top_maps,
        "text_offset": _offsets(tokens, text_offset),
    }


def _chat_entry(tokenizer: Tokenizer, token: int, logprob: float) -> dict:
    text = _token_text(tokenizer, token)
    return {"token": text, "logprob": _json_logprob(logprob), "bytes": list(text.encode())}


def chat_logprobs(
    tokenizer: Tokenizer,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[TopLogprobs] | None,
) -> dict:
    """A chat choice's `logprobs`: an entry per token, with its position's most likely tokens."""
    tops = top if top is not None else [[] for _ in token_ids]
    content = [
        {
            **_chat_entry(tokenizer, token, logprob),
            "top_logprobs": [_chat_entry(tokenizer, *t) for t in position],
        }
        for token, logprob, position in zip(token_ids, logprobs, tops, strict=True)
    ]
    return {"content": content}


def best_of_each(completions: Sequence[Completion], n: int) -> list[Completion]:
    """The `n` completions of one prompt with the highest logprob per token (OpenAI's `best_of`),
    best first; all of them, in order, when there are `n`."""
    if len(completions) == n:
        return list(completions)
    ranked = sorted(completions, key=lambda c: sum(c.logprobs) / max(1, len(c.logprobs)), reverse=True)
    return ranked[:n]


def usage(prompt_tokens: int, generated: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }


def completion_body(
    request: CompletionRequest,
    tokenizer: Tokenizer,
    model_id: str,
    prompt_tokens: int,
    completions: Sequence[Completion],
    echoes: Sequence[Echo] | None = None,
) -> dict:
    """`echoes`: with `echo`, the prompt of each choice."""
    stops = stop_strings(request)
    choices = []
    for index, completion in enumerate(completions):
        token_ids, logprobs, top = completion.token_ids, completion.logprobs, completion.top_logprobs
        if echoes is not None:
            echo = echoes[index]
            token_ids = echo.token_ids + token_ids
            logprobs = echo.logprobs + logprobs
            if top is not None and echo.top is not None:
                top = echo.top + top
        text, stopped = visible_text(tokenizer, completion.token_ids, stops, request.min_tokens)
        if echoes is not None:
            text = tokenizer.decode(echoes[index].token_ids) + text
        choices.append(
            {
                "index": index,
                "text": text,
                "logprobs": None
                if request.logprobs is None
                else completion_logprobs(tokenizer, token_ids, logprobs, top),
                "finish_reason": "stop" if stopped else completion.finish_reason,
            }
        )
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model_id,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in completions)),
    }


def chat_body(
    request: ChatCompletionRequest,
    tokenizer: Tokenizer,
    model_id: str,
    prompt_tokens: int,
    completions: Sequence[Completion],
) -> dict:
    stops = stop_strings(request)
    mode = request.tool_mode()
    choices = []
    for index, completion in enumerate(completions):
        logprobs = None
        if request.logprobs:
            logprobs = chat_logprobs(
                tokenizer, completion.token_ids, completion.logprobs, completion.top_logprobs
            )
        text, stopped = visible_text(tokenizer, completion.token_ids, stops, request.min_tokens)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason = "stop" if stopped else completion.finish_reason
        if mode != "none":
            if mode == "auto":
                content, calls = split_tool_calls(text, request.tool_call_limit())
            else:
                content, calls = forced_tool_calls(text, request.forced_name())
            if calls:
                message = {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [c.to_openai() for c in calls],
                }
                reason = "tool_calls"
        choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason})
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model_id,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in completions)),
    }


def _offsets(tokens: Sequence[str], position: int) -> list[int]:
    offsets = []
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return offsets


class ContextLengthExceeded(RequestError):
    """A prompt and completion that do not fit the context (code `context_length_exceeded`)."""

    code = "context_length_exceeded"


def check_context(
    prompt: Sequence[int],
    max_tokens: int,
    max_model_len: int,
    field: str,
    max_tokens_field: str = "max_tokens",
) -> None:
    """OpenAI's context-overflow error for a prompt that leaves no room for a token (naming
    `field`), or whose `max_tokens` runs past the context (naming `max_tokens_field`)."""
    if len(prompt) < max_model_len and len(prompt) + max_tokens <= max_model_len:
        return
    where = "messages" if field == "messages" else "prompt"
    raise ContextLengthExceeded(
        field if len(prompt) >= max_model_len else max_tokens_field,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{len(prompt) + max(max_tokens, 1)} tokens ({len(prompt)} in the {where}, {max(max_tokens, 1)} in the "
        f"completion). Please reduce the length of the {where} or completion.",
    )


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
