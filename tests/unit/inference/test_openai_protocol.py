"""OpenAI request translation: prompts, stop strings, defaults, incremental text, bodies."""

import json

import pytest
from pydantic import ValidationError

from rlrun.common.errors import RequestError
from rlrun.common.hermes import tools_prompt
from rlrun.common.tokenizer import CharTokenizer
from rlrun.common.wire.inference import Completion
from rlrun.inference.openai.prompts import chat_prompts, completion_prompts
from rlrun.inference.openai.protocol import ChatCompletionRequest, CompletionRequest
from rlrun.inference.openai.request_params import sampling_params, text_stop_strings
from rlrun.inference.openai.responses import Echo, best_of_each, chat_body, completion_body
from rlrun.inference.openai.structured_outputs import structured_output
from rlrun.inference.openai.text import TextStream, visible_text
from rlrun.inference.openai.tool_calls import split_tool_calls
from rlrun.inference.openai.tool_parsers import ToolCall
from rlrun.inference.openai.tool_parsers.hermes import HermesParser

from .conftest import LIMITS, REPO


@pytest.fixture
def tokenizer():
    return CharTokenizer.from_file(REPO / "configs/tokenizer/char")


def test_chat_prompts_use_the_tokenizers_chat_rendering(tokenizer):
    request = ChatCompletionRequest(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "ab"}]},
        ]
    )
    expected = (
        tokenizer.render_message("system", "be brief")
        + tokenizer.render_message("user", "ab")
        + tokenizer.message_header("assistant")
    )
    assert chat_prompts(request, tokenizer, LIMITS) == [("messages", expected)]


def test_stop_strings_become_stop_token_ids_with_the_end_token(tokenizer):
    request = CompletionRequest(prompt="abc", stop=["x", "\n"], stop_token_ids=[7])
    params = sampling_params(request, tokenizer, prompt_len=3, max_model_len=32, max_tokens=None)
    assert params.stop_token_ids == sorted({tokenizer.eos_token_id, 7, *tokenizer.encode("x\n")})
    assert params.max_tokens == 29


def test_min_p_reaches_the_engine(tokenizer):
    request = CompletionRequest(prompt="abc", min_p=0.25)
    request.check_fields()
    assert sampling_params(request, tokenizer, 3, 32, 4).min_p == 0.25
    assert sampling_params(CompletionRequest(prompt="abc"), tokenizer, 3, 32, 4).min_p == 0.0


def test_penalties_and_logit_bias_reach_the_engine(tokenizer):
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}],
        presence_penalty=0.5,
        frequency_penalty=-1,
        logit_bias={"5": 100, "17": -2.5},
        repetition_penalty=1.3,
    )
    request.check_fields()
    params = sampling_params(request, tokenizer, 3, 32, 4)
    penalties = params.knobs["penalties"]
    assert (penalties.presence_penalty, penalties.frequency_penalty, penalties.repetition_penalty) == (
        0.5,
        -1.0,
        1.3,
    )
    assert params.knobs["logit_bias"] == {5: 100.0, 17: -2.5}
    unset = sampling_params(CompletionRequest(prompt="abc", presence_penalty=None), tokenizer, 3, 32, 4)
    assert unset.knobs == {}  # no knob: the engine's logits are the model's own


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"a": 1}}, "logit_bias"),
        ({"logit_bias": {"128": 1}}, "body.logit_bias"),
        ({"logit_bias": {"5": 100.5}}, "body.logit_bias"),
        ({"presence_penalty": 2.5}, "body.presence_penalty"),
        ({"frequency_penalty": -3}, "body.frequency_penalty"),
        ({"repetition_penalty": 0}, "body.repetition_penalty"),
        ({"min_p": 1.5}, "body.min_p"),
        ({"min_p": -0.1}, "body.min_p"),
    ],
)
def test_a_bad_penalty_or_logit_bias_is_refused_by_name(tokenizer, fields, param):
    with pytest.raises(RequestError) as caught:
        sampling_params(CompletionRequest(prompt="abc", **fields), tokenizer, 3, 32, 4).validate(
            "body", vocab_size=128
        )
    assert caught.value.field == param


def test_best_of_draws_more_samples_and_keeps_the_best_per_token(tokenizer):
    request = CompletionRequest(prompt="abc", n=2, best_of=4)
    request.check_fields()
    assert sampling_params(request, tokenizer, 3, 32, 4).n == 4
    samples = [
        Completion([1, 2], [-1.0, -1.0], "length", 0, 0),
        Completion([3], [-0.5], "stop", 0, 0),
        Completion([4, 5, 6], [-0.1, -0.2, -0.3], "length", 0, 0),
        Completion([7, 8], [-3.0, -0.1], "length", 0, 0),
    ]
    assert [c.token_ids for c in best_of_each(samples, 2)] == [[4, 5, 6], [3]]
    assert best_of_each(samples[:2], 2) == samples[:2]  # n of n: all, in order


@pytest.mark.parametrize("fields", [{"n": 3, "best_of": 2}, {"n": 1, "best_of": 3, "stream": True}])
def test_best_of_below_n_or_streamed_is_refused(tokenizer, fields):
    with pytest.raises(RequestError) as caught:
        sampling_params(CompletionRequest(prompt="abc", **fields), tokenizer, 3, 32, 4)
    assert caught.value.field == "best_of"


def test_stop_sequences_of_several_tokens_are_left_to_the_text(tokenizer):
    request = CompletionRequest(prompt="abc", stop=["xy", "z"])
    assert text_stop_strings(request, tokenizer) == ["xy"]
    assert sampling_params(request, tokenizer, 3, 32, 4).stop_token_ids == sorted(
        {tokenizer.eos_token_id, *tokenizer.encode("z")}
    )
    with pytest.raises(RequestError) as caught:
        sampling_params(CompletionRequest(prompt="abc", stop=["x", ""]), tokenizer, 3, 32, 4)
    assert caught.value.field == "stop[1]"


def test_min_tokens_masks_the_stop_tokens_and_leaves_every_stop_sequence_to_the_text(tokenizer):
    request = CompletionRequest(prompt="abc", stop=["xy", "z"], stop_token_ids=[7], min_tokens=3)
    params = sampling_params(request, tokenizer, 3, 32, 4)
    # vLLM masks the end token and stop_token_ids only: "z" may be drawn, it just cannot end
    # the text before min_tokens, so the text watches it.
    assert params.knobs["min_tokens"] == 3 and params.stop_token_ids == sorted({7, tokenizer.eos_token_id})
    assert text_stop_strings(request, tokenizer) == ["xy", "z"]
    for bad in (-1, 5):
        with pytest.raises(RequestError) as caught:
            sampling_params(CompletionRequest(prompt="abc", min_tokens=bad), tokenizer, 3, 32, 4).validate("")
        assert caught.value.field.endswith("min_tokens")


def test_no_stop_sequence_ends_the_text_within_its_first_min_tokens(tokenizer):
    tokens = tokenizer.encode("ab.cd.ef")
    assert visible_text(tokenizer, tokens, ["."], min_tokens=3) == ("ab.cd", True)
    assert visible_text(tokenizer, tokens, ["."], min_tokens=2) == ("ab", True)  # ends past 2
    assert visible_text(tokenizer, tokens, ["b.c"], min_tokens=3) == ("a", True)  # ends at "c"
    assert visible_text(tokenizer, tokens, ["b.c"], min_tokens=4) == ("ab.cd.ef", False)
    assert visible_text(tokenizer, tokens[:2], ["a"], min_tokens=3) == ("ab", False)
    stream = TextStream(tokenizer, ["."], min_tokens=3)
    assert [stream.push(tokenizer.encode(part)) for part in ["a", "b.", "c"]] == ["a", "b.", "c"]
    assert not stream.stopped
    assert stream.push(tokenizer.encode("d.e")) == "d" and stream.stopped


def test_the_text_ends_before_the_first_stop_sequence(tokenizer):
    assert visible_text(tokenizer, tokenizer.encode("hello world"), ["o", "lo w"]) == ("hel", True)
    assert visible_text(tokenizer, tokenizer.encode("hello"), ["xyz"]) == ("hello", False)


def test_a_text_stream_holds_back_what_could_begin_a_stop_sequence(tokenizer):
    stream = TextStream(tokenizer, ["abc"])
    pieces = [stream.push(tokenizer.encode(part)) for part in ["xya", "b", "xab"]]
    assert pieces == ["x", "y", "abx"] and not stream.stopped  # the last 2 might begin "abc"
    assert stream.push(tokenizer.encode("cq")) == "" and stream.stopped
    assert stream.emitted == "xyabx" and stream.push(tokenizer.encode("z")) == ""
    ending = TextStream(tokenizer, ["abc"])
    assert ending.push(tokenizer.encode("qab")) == "q"
    assert ending.finish() == "ab"  # the sample ended otherwise: the tail is text after all


def test_a_body_cuts_each_choice_at_its_stop_sequence(tokenizer):
    tokens = tokenizer.encode("yes. no")
    completion = Completion(tokens, [-0.1] * len(tokens), "length", 0, 0)
    body = completion_body(CompletionRequest(prompt="q", stop=". "), tokenizer, "m", 1, [completion])
    assert body["choices"][0]["text"] == "yes" and body["choices"][0]["finish_reason"] == "stop"
    chat = chat_body(
        ChatCompletionRequest(messages=[{"role": "user"}], stop="zz"),
        tokenizer,
        "m",
        1,
        [completion],
        HermesParser,
    )
    assert chat["choices"][0]["message"]["content"] == "yes. no"
    assert chat["choices"][0]["finish_reason"] == "length"


def test_an_echoed_prompt_comes_first_with_its_logprobs(tokenizer):
    a, b, c = tokenizer.encode("abc")
    echo = Echo([a, b], [None, -0.7], [None, [(b, -0.7), (c, -0.9)]])
    completion = Completion([c], [-0.2], "length", 0, 0, [[(c, -0.2), (a, -3.0)]])
    body = completion_body(
        CompletionRequest(prompt="ab", echo=True, logprobs=2), tokenizer, "m", 2, [completion], [echo]
    )
    [choice] = body["choices"]
    assert choice["text"] == "abc"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["a", "b", "c"] and logprobs["text_offset"] == [0, 1, 2]
    assert logprobs["token_logprobs"] == [None, -0.7, -0.2]
    assert logprobs["top_logprobs"] == [None, {"b": -0.7, "c": -0.9}, {"c": -0.2, "a": -3.0}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}


@pytest.mark.parametrize(
    ("body", "count"),
    [
        (CompletionRequest(prompt="a"), 0),
        (CompletionRequest(prompt="a", logprobs=0), 0),
        (CompletionRequest(prompt="a", logprobs=5), 5),
        (ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], logprobs=True), 0),
        (ChatCompletionRequest(messages=[{"role": "user"}], logprobs=True, top_logprobs=20), 20),
    ],
)
def test_how_many_alternatives_a_request_asks_for(tokenizer, body, count):
    assert sampling_params(body, tokenizer, 1, 32, 4).top_logprobs == count


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (CompletionRequest(prompt="a", logprobs=21), "logprobs"),
        (ChatCompletionRequest(messages=[{"role": "user"}], logprobs=True, top_logprobs=21), "top_logprobs"),
        (ChatCompletionRequest(messages=[{"role": "user"}], top_logprobs=2), "logprobs"),
    ],
)
def test_too_many_alternatives_or_top_logprobs_without_logprobs_are_refused(tokenizer, body, field):
    with pytest.raises(RequestError) as caught:
        sampling_params(body, tokenizer, 1, 32, 4)
    assert caught.value.field == field


def test_bodies_carry_each_positions_most_likely_tokens(tokenizer):
    a, b = tokenizer.encode("ab")
    completion = Completion(
        [a, b], [-0.5, -0.25], "length", 0, 0, [[(a, -0.5), (b, -1.0)], [(b, -0.25), (a, -2.0)]]
    )
    chat = chat_body(
        ChatCompletionRequest(messages=[{"role": "user"}], logprobs=True, top_logprobs=2),
        tokenizer,
        "m",
        1,
        [completion],
        HermesParser,
    )
    [first, second] = chat["choices"][0]["logprobs"]["content"]
    assert first["top_logprobs"] == [
        {"token": "a", "logprob": -0.5, "bytes": [97]},
        {"token": "b", "logprob": -1.0, "bytes": [98]},
    ]
    assert [t["token"] for t in second["top_logprobs"]] == ["b", "a"]
    text = completion_body(CompletionRequest(prompt="x", logprobs=2), tokenizer, "m", 1, [completion])
    logprobs = text["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"] == [{"a": -0.5, "b": -1.0}, {"b": -0.25, "a": -2.0}]
    assert logprobs["tokens"] == ["a", "b"] and logprobs["text_offset"] == [0, 1]


def test_an_alternative_truncated_away_reports_vllms_lowest_logprob_in_valid_json(tokenizer):
    a, b = tokenizer.encode("ab")
    completion = Completion([a], [0.0], "length", 0, 0, [[(a, 0.0), (b, float("-inf"))]])
    chat = chat_body(
        ChatCompletionRequest(messages=[{"role": "user"}], logprobs=True, top_logprobs=2),
        tokenizer,
        "m",
        1,
        [completion],
        HermesParser,
    )
    [entry] = chat["choices"][0]["logprobs"]["content"]
    assert [t["logprob"] for t in entry["top_logprobs"]] == [0.0, -9999.0]
    text = completion_body(CompletionRequest(prompt="x", logprobs=2), tokenizer, "m", 1, [completion])
    assert text["choices"][0]["logprobs"]["top_logprobs"] == [{"a": 0.0, "b": -9999.0}]
    json.dumps([chat, text], allow_nan=False)


def test_token_id_prompts_pass_through(tokenizer):
    assert completion_prompts(CompletionRequest(prompt=[3, 4, 5]), tokenizer, LIMITS) == [
        ("prompt", [3, 4, 5])
    ]


def test_a_batch_of_prompts_names_each_one(tokenizer):
    texts = completion_prompts(CompletionRequest(prompt=["ab", "c"]), tokenizer, LIMITS)
    assert texts == [("prompt[0]", tokenizer.encode("ab")), ("prompt[1]", tokenizer.encode("c"))]
    ids = completion_prompts(CompletionRequest(prompt=[[3, 4], [5]]), tokenizer, LIMITS)
    assert ids == [("prompt[0]", [3, 4]), ("prompt[1]", [5])]


@pytest.mark.parametrize("prompt", [["ab", 3], [3, "ab"], [[3], "ab"], 7, None])
def test_a_prompt_of_no_known_shape_gets_one_clear_error(prompt):
    with pytest.raises(ValidationError) as caught:
        CompletionRequest(prompt=prompt)
    [error] = caught.value.errors()
    assert error["loc"] == ("prompt",)
    assert error["msg"].startswith("prompt must be a string, a list of token ids, or a batch")


def test_text_stream_emits_each_new_piece_once(tokenizer):
    stream = TextStream(tokenizer)
    pieces = [
        stream.push(tokenizer.encode("he")),
        stream.push(tokenizer.encode("y")),
        stream.push([tokenizer.eos_token_id]),
    ]
    assert pieces == ["he", "y", ""]


def test_chat_body_carries_text_logprobs_and_usage(tokenizer):
    tokens = tokenizer.encode("ok") + [tokenizer.eos_token_id]
    completion = Completion(tokens, [-0.1, -0.2, -0.3], "stop", 0, 0)
    body = chat_body(
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], logprobs=True),
        tokenizer,
        "m",
        5,
        [completion],
        HermesParser,
    )
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "ok"}
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.1, -0.2, -0.3]
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


@pytest.mark.parametrize(
    "fields",
    [
        {"best_of": 2, "n": 2},
        {"suffix": "", "user": "bob", "metadata": {"run": "7"}},
    ],
)
def test_unimplemented_fields_that_change_nothing_are_accepted(fields):
    CompletionRequest(prompt="abc", **fields).check_fields()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"suffix": "!"}, "suffix"),
    ],
)
def test_a_completion_field_that_would_be_ignored_is_refused_by_name(fields, param):
    with pytest.raises(RequestError) as caught:
        CompletionRequest(prompt="abc", **fields).check_fields()
    assert caught.value.field == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"audio": {"voice": "alloy"}}, "audio"),
    ],
)
def test_a_chat_field_that_would_be_ignored_is_refused_by_name(fields, param):
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)
    with pytest.raises(RequestError) as caught:
        request.check_fields()
    assert caught.value.field == param
    ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], functions=[], response_format={"type": "text"}
    ).check_fields()


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "messages[1].content[0].type",
        ),
        ({"role": "user", "content": [{"type": "text"}]}, "messages[1].content[0].text"),
        (
            {"role": "user", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            "messages[1].tool_calls",
        ),
        ({"role": "assistant", "function_call": {"name": "f"}}, "messages[1].function_call"),
    ],
)
def test_chat_content_that_cannot_be_rendered_is_refused_by_name(tokenizer, message, param):
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}, message])
    with pytest.raises(RequestError) as caught:
        chat_prompts(request, tokenizer, LIMITS)
    assert caught.value.field == param


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {}}}},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tools_and_earlier_calls_are_rendered_in_the_hermes_format(tokenizer):
    request = ChatCompletionRequest(
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        tools=[WEATHER],
    )
    [(_, prompt)] = chat_prompts(request, tokenizer, LIMITS)
    expected = (
        tokenizer.render_message("system", "be brief\n\n" + tools_prompt([WEATHER]))
        + tokenizer.render_message("user", "weather?")
        + tokenizer.render_message("assistant", CALL_TEXT)
        + tokenizer.render_message("tool", "sunny")
        + tokenizer.message_header("assistant")
    )
    assert prompt == expected
    assert '"name": "get_weather"' in tokenizer.decode(prompt)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("fields", "field", "schema"),
    [
        ({}, None, None),
        ({"response_format": {"type": "text"}}, None, None),
        ({"response_format": {"type": "json_object"}}, "response_format", {"type": "object"}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {"type": "array"}},
                }
            },
            "response_format",
            {"type": "array"},
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "response_format", {}),
        ({"tools": [WEATHER], "tool_choice": "auto"}, None, None),
        ({"tools": [WEATHER, TIME], "tool_choice": NAMED}, "tool_choice", WEATHER["function"]["parameters"]),
        (
            {"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "tool_choice",
            {"type": "object"},
        ),
    ],
)
def test_the_constraint_a_request_asks_for(fields, field, schema):
    structured = structured_output(ChatCompletionRequest(**CHAT, **fields))
    if field is None:
        assert structured is None
    else:
        assert (structured[0], json.loads(structured[1])) == (field, schema)


@pytest.mark.parametrize("parallel", [None, False])
def test_tool_choice_required_asks_for_an_array_of_calls_of_the_tools_offered(parallel):
    request = ChatCompletionRequest(
        **CHAT, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel
    )
    field, text = structured_output(request)
    schema = json.loads(text)
    assert field == "tool_choice" and schema["type"] == "array" and schema["minItems"] == 1
    assert schema.get("maxItems") == (1 if parallel is False else None)
    calls = schema["items"]["anyOf"]
    assert [c["properties"]["name"]["enum"] for c in calls] == [["get_weather"], ["get_time"]]
    assert [c["properties"]["parameters"] for c in calls] == [
        WEATHER["function"]["parameters"],
        {"type": "object"},
    ]
    assert all(c["required"] == ["name", "parameters"] for c in calls)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[0].function.parameters",
        ),
    ],
)
def test_a_constraint_that_cannot_be_kept_is_refused_by_field(tokenizer, fields, param):
    request = ChatCompletionRequest(**CHAT, **fields)
    with pytest.raises(RequestError) as caught:
        chat_prompts(request, tokenizer, LIMITS)
        structured_output(request)
    assert caught.value.field == param


def test_a_completion_takes_a_response_format_too():
    request = CompletionRequest(prompt="abc", response_format={"type": "json_object"})
    assert structured_output(request) == ("response_format", '{"type": "object"}')


def test_a_bad_tool_or_earlier_call_is_a_validation_error():
    with pytest.raises(ValidationError, match="tools.0.type"):
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[{"type": "retrieval"}])
    with pytest.raises(ValidationError, match="JSON object"):
        ChatCompletionRequest(
            messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]
        )


def completion_of(tokenizer, text: str, reason: str = "stop") -> Completion:
    ids = tokenizer.encode(text)
    return Completion(ids, [-0.1] * len(ids), reason, 0, 0)


@pytest.mark.parametrize(
    ("tool_fields", "text", "content", "names", "reason"),
    [
        ({"tools": [WEATHER]}, "Checking.\n" + CALL_TEXT, "Checking.", ["get_weather"], "tool_calls"),
        (
            {"tools": [WEATHER]},
            CALL_TEXT + "\n" + CALL_TEXT,
            None,
            ["get_weather", "get_weather"],
            "tool_calls",
        ),
        (
            {"tools": [WEATHER], "parallel_tool_calls": False},
            CALL_TEXT + CALL_TEXT,
            None,
            ["get_weather"],
            "tool_calls",
        ),
        ({"tools": [WEATHER], "tool_choice": "none"}, CALL_TEXT, CALL_TEXT, [], "stop"),
        (
            {"tools": [WEATHER]},
            "<tool_call>{not json}</tool_call>",
            "<tool_call>{not json}</tool_call>",
            [],
            "stop",
        ),
        ({}, CALL_TEXT, CALL_TEXT, [], "stop"),
        (
            {"tools": [WEATHER], "tool_choice": "required"},
            '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_weather", "parameters": {"city": "Paris"}}]',
            None,
            ["get_weather", "get_weather"],
            "tool_calls",
        ),
        (
            {"tools": [WEATHER], "tool_choice": NAMED},
            '{"city": "Paris"}',
            None,
            ["get_weather"],
            "tool_calls",
        ),
        # Cut short by max_tokens: no call, the text stays.
        ({"tools": [WEATHER], "tool_choice": NAMED}, '{"city": "Pa', '{"city": "Pa', [], "stop"),
        (
            {"tools": [WEATHER], "tool_choice": "required"},
            '[{"name": "get_weather"}]',
            '[{"name": "get_weather"}]',
            [],
            "stop",
        ),
    ],
)
def test_the_answer_carries_the_tool_calls_it_wrote(tokenizer, tool_fields, text, content, names, reason):
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **tool_fields)
    body = chat_body(request, tokenizer, "m", 3, [completion_of(tokenizer, text)], HermesParser)
    [choice] = body["choices"]
    assert choice["message"]["content"] == content
    calls = choice["message"].get("tool_calls", [])
    assert [c["function"]["name"] for c in calls] == names
    assert all(json.loads(c["function"]["arguments"]) == {"city": "Paris"} for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)
    assert choice["finish_reason"] == reason


@pytest.mark.parametrize("piece", [1, 2, 5, 13])
def test_a_streamed_answer_splits_into_the_same_content_and_calls(piece):
    text = (
        "Let me see. <tool_c" + "all>x</tool_call> then\n" + CALL_TEXT + "\n\n" + CALL_TEXT + "\n<tool_call>{"
    )
    whole_content, whole_calls = split_tool_calls(text, HermesParser)
    stream = HermesParser()
    items = []
    for start in range(0, len(text), piece):
        items += stream.push(text[start : start + piece])
    items += stream.finish()
    assert "".join(i for i in items if isinstance(i, str)) == whole_content
    streamed = [i for i in items if isinstance(i, ToolCall)]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in whole_calls]
    assert len(streamed) == 2
    assert whole_content == "Let me see. <tool_call>x</tool_call> then\n<tool_call>{"
