"""Structured outputs as an OpenAI request asks for them: `response_format` {"type":
"json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}} constrains a
choice's text to a JSON object or to a value matching the schema (chat and completions, as in
vLLM); a chat's `tool_choice` "required" or a named function constrains it to JSON too, as
vLLM does: a non-empty array of {"name", "parameters"} objects, one per call, of the tools
offered ("required"; one at most with `parallel_tool_calls` false), or the named function's
arguments object. The schema reaches the engine as the `json_schema` knob (`Grammar`,
`rlrun.inference.structured`). A schema llguidance cannot compile is a 400 naming it.
"""

from __future__ import annotations

from rlrun.common.errors import RequestError
from rlrun.inference.engines.base import Engine
from rlrun.inference.openai.protocol import ChatCompletionRequest, SamplingFields, ToolIn
from rlrun.inference.structured import GrammarCompiler, schema_text

StructuredOutput = tuple[str, str]
"""(the request field that asked for it, the JSON schema as text)."""


def structured_output(request: SamplingFields) -> StructuredOutput | None:
    """The JSON schema every choice must match, and the field that asked for it; None when
    the text is free."""
    if isinstance(request, ChatCompletionRequest):
        mode = request.tool_mode()
        if mode in ("required", "named"):
            return _tool_calls(request, mode)
    return _response_format(request)


def _response_format(request: SamplingFields) -> StructuredOutput | None:
    form = request.response_format
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return "response_format", schema_text({"type": "object"}, "response_format")
    if form.json_schema is None:
        raise RequestError("response_format.json_schema", 'type "json_schema" needs a json_schema')
    schema = {} if form.json_schema.schema_ is None else form.json_schema.schema_
    field = "response_format.json_schema.schema"
    return "response_format", schema_text(schema, field)


def _tool_calls(request: ChatCompletionRequest, mode: str) -> StructuredOutput:
    if request.response_format is not None and request.response_format.type != "text":
        raise RequestError("response_format", f'response_format cannot be combined with tool_choice "{mode}"')
    tools = request.tools or []
    if mode == "named":
        index = tools.index(request.named_tool())
        field = f"tools[{index}].function.parameters"
        return "tool_choice", schema_text(_parameters(tools[index]), field)
    calls: dict = {
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
                for tool in tools
            ]
        },
    }
    if request.parallel_tool_calls is False:
        calls["maxItems"] = 1
    return "tool_choice", schema_text(calls, "tools")


def _parameters(tool: ToolIn) -> dict | bool:
    """The JSON schema of a tool's arguments (an object of any fields when it has none)."""
    parameters = (tool.function.model_extra or {}).get("parameters")
    return {"type": "object"} if parameters is None else parameters


def request_schema(request: SamplingFields, engine: Engine, grammars: GrammarCompiler) -> str | None:
    """The request's schema, once it is known that the engine can follow it and the
    tokenizer can begin such a value (each a 400 naming the field that asked)."""
    structured = structured_output(request)
    if structured is None:
        return None
    field, schema = structured
    if not engine.structured_outputs:
        raise RequestError(field, f"the {engine.name} engine does not constrain its output, as {field} asks")
    grammars.check_writable(schema, field)
    return schema
