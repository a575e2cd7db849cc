"""Tool calls in each format a tool-call parser reads (`rlrun.inference.openai.tool_parsers`):
an answer per format, the calls it writes, and the part of a real chat template that teaches
the format (what `tool_call_parser = "auto"` reads). Shared by the parsers' unit tests and the
OpenAI API tests."""

from __future__ import annotations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "hourly": {"type": "boolean"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]
CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]
# Per format: an answer with content and two calls, and its content (None: calls only).
ANSWERS = {
    "hermes": (
        "Let me look.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
        "Let me look.",
    ),
    "qwen3_coder": (
        "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>",
        "Let me look.",
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}',
        None,
    ),
    "mistral": (
        'Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]',
        "Let me look.",
    ),
}
MISTRAL_V11 = 'Let me look. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'


# The parts of real chat templates that teach each format (Qwen2.5/Qwen3, Qwen3-Coder,
# Llama 3.1, Mistral).
TEMPLATES = {
    "hermes": (
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\\n</tool_call><|im_end|>"
    ),
    "qwen3_coder": (
        "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n"
        "</parameter>\\n</function>\\n</tool_call>"
    ),
    "llama3_json": (
        '{%- elif message.role == "tool" or message.role == "ipython" %}'
        '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}'
    ),
    "mistral": "{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}{%- for tool_call in message.tool_calls %}",
}


def chat_template(name: str) -> str:
    """A chat template that renders messages and tools, and holds the part of `name`'s real
    template that teaches its format (in a Jinja comment: what renders is the same for every
    format)."""
    return (
        "{#- " + TEMPLATES[name] + " -#}"
        "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
        "<|im_end|>{% endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
