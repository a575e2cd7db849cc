"""The in-repo character tokenizer: stable ids, round trips, concatenative chat rendering."""

import importlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlrun.common.hermes import calls_text, tools_prompt
from rlrun.common.tokenizer import (
    ROLES,
    CharTokenizer,
    ChatMessage,
    HFTokenizer,
    load_tokenizer,
    render_chat,
)
from rlrun.common.tokenizer_info import tokenizer_info

from ...support.byte_level import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[3]
CHAR = REPO / "configs/tokenizer/char"


def test_ids_are_stable():
    tok = CharTokenizer.from_file(CHAR)
    assert (tok.vocab_size, tok.pad_token_id, tok.eos_token_id) == (102, 0, 1)
    assert tok.encode("abc") == [71, 72, 73]
    # Any change to the shipped vocabulary breaks every saved checkpoint: pin its content (the
    # hash the tokenizer's identity on the wire carries, unchanged since the vocabulary was a
    # plain JSON list).
    assert tokenizer_info(tok, CHAR).sha256[:12] == "91f11a8a8fa0"
    assert tokenizer_info(tok, CHAR).name == "char:char"
    assert tok.id_to_token[:6] == ["<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]


def test_round_trip_and_specials():
    tok = load_tokenizer(CHAR)
    text = "Hello, world! 12+3=15\n"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.render_message("user", "hi")
    assert ids == [3, *tok.encode("hi"), 1]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|user|>hi<|end|>"
    assert tok.encode("é") == tok.encode("?")


def test_chat_rendering_is_concatenative():
    tok = load_tokenizer(CHAR)
    history = [ChatMessage("system", "be brief"), ChatMessage("user", "abc"), ChatMessage("assistant", "cba")]
    full = render_chat(tok, history, add_generation_prompt=False)
    assert full == sum((tok.render_message(m.role, m.content) for m in history), [])
    extended = render_chat(tok, [*history, ChatMessage("user", "again")])
    assert extended[: len(full)] == full
    assert extended[-1] == tok.message_header("assistant")[0]


def test_bad_inputs():
    tok = load_tokenizer(CHAR)
    with pytest.raises(ValueError, match="unknown chat role"):
        tok.message_header("narrator")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(REPO / "configs/tokenizer/missing")
    with pytest.raises(ValueError, match="no tokenizer"):
        load_tokenizer(None, None)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
# A template in Qwen's manner: tools go into the system message.
WITH_TOOLS = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n{% for tool in tools %}{{ tool | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if not (tools and loop.first and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WITHOUT_TOOLS = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def hf_tokenizer(tmp_path, template: str):
    """A byte-level tokenizer with `template`, saved and loaded as a checkpoint's is."""
    byte_level_tokenizer("<|im_end|>", ["<|im_start|>"], template).save_pretrained(tmp_path)
    return load_tokenizer(None, tmp_path)


def test_a_checkpoints_template_offers_the_tools_its_own_way(tmp_path):
    tok = hf_tokenizer(tmp_path, WITH_TOOLS)
    offered = tok.decode(tok.render_tools(TOOLS, "be brief"), skip_special_tokens=False)
    assert offered == (
        '<|im_start|>system\nbe brief\n# Tools\n{"type": "function", "function": {"name": "get_weather", '
        '"parameters": {"type": "object"}}}<|im_end|>\n'
    )
    chat = render_chat(tok, [ChatMessage("system", "be brief"), ChatMessage("user", "hi")], tools=TOOLS)
    assert tok.decode(chat, skip_special_tokens=False) == (
        offered + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_without_tools_gets_them_as_a_system_message(tmp_path):
    tok = hf_tokenizer(tmp_path, WITHOUT_TOOLS)
    offered = tok.decode(tok.render_tools(TOOLS, None), skip_special_tokens=False)
    assert offered == f"<|im_start|>system\n{tools_prompt(TOOLS)}<|im_end|>\n"
    char = load_tokenizer(CHAR)
    assert char.render_tools(TOOLS, "be brief") == char.render_message(
        "system", "be brief\n\n" + tools_prompt(TOOLS)
    )


# The character tokenizers as Hugging Face tokenizers: transformers loads the same folders that
# rlrun reads, and gives the same ids.

transformers = importlib.import_module("transformers")
FOLDERS = {name: REPO / "configs/tokenizer" / name for name in ("char", "lowercase")}
HF = {name: transformers.AutoTokenizer.from_pretrained(str(path)) for name, path in FOLDERS.items()}
RLRUN = {name: load_tokenizer(path) for name, path in FOLDERS.items()}
SPECIALS = ("<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")


def _texts() -> st.SearchStrategy[str]:
    """Text over the char alphabet, whitespace the vocabulary lacks (tabs, carriage returns),
    characters outside every vocabulary (accents, emoji, CJK, combining marks, astral planes)
    and pieces of the specials' spelling (no lone surrogates: no text holds them)."""
    alphabet = st.sampled_from(sorted(CharTokenizer.from_file(FOLDERS["char"]).chars))
    foreign = st.sampled_from(
        ["\t", "\r", "\u00e9", "\u00df", "\u4e2d", "\U0001f642", "\u0301", "\u200b", "\x00"]
    )
    pieces = st.sampled_from(["<|", "|>", "<pad", "end", "<|user", "assistant|>", "?"])
    return st.lists(
        st.one_of(alphabet, foreign, pieces, st.characters(exclude_categories=("Cs",))), max_size=40
    ).map("".join)


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_transformers_loads_the_folder_with_rlruns_specials(name):
    hf, ours = HF[name], RLRUN[name]
    assert isinstance(ours, CharTokenizer)
    assert len(hf) == ours.vocab_size
    assert (hf.eos_token_id, hf.pad_token_id) == (ours.eos_token_id, ours.pad_token_id)
    assert [hf.convert_ids_to_tokens(i) for i in range(ours.vocab_size)] == ours.id_to_token
    assert set(hf.all_special_tokens) == set(SPECIALS)
    assert ours.encode("\u00e9") == ours.encode("?") == [{"char": 37, "lowercase": 32}[name]]  # unknown: "?"


@pytest.mark.parametrize("name", sorted(FOLDERS))
@FAST
@given(text=_texts())
def test_transformers_gives_rlruns_ids_and_text(name, text):
    assume(not any(special in text for special in SPECIALS))  # a special's spelling: below
    hf, ours = HF[name], RLRUN[name]
    ids = ours.encode(text)
    assert hf.encode(text, add_special_tokens=False) == ids
    assert hf(text, add_special_tokens=True)["input_ids"] == ids  # no BOS/EOS of its own
    assert hf.decode(ids) == ours.decode(ids)
    with_specials = [ours.message_header("user")[0], *ids, ours.eos_token_id]
    for skip in (True, False):
        assert hf.decode(with_specials, skip_special_tokens=skip) == ours.decode(with_specials, skip)


def test_a_specials_spelling_is_the_special_to_transformers_and_characters_to_rlrun():
    """The one difference, Hugging Face's own: its tokenizers match added tokens in text."""
    hf, ours = HF["char"], RLRUN["char"]
    assert hf.encode("a<|end|>b", add_special_tokens=False) == [ours.encode("a")[0], 1, ours.encode("b")[0]]
    assert ours.encode("a<|end|>b") == ours.encode("a") + ours.encode("<|end|>") + ours.encode("b")
    assert 1 not in ours.encode("<|end|>")


def _message(role: str, content: str) -> dict:
    return {"role": role, "content": content}


CONTENT = _texts().filter(lambda text: not any(special in text for special in SPECIALS))
TOOL_SPECS = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": st.text("abcdefgh_", min_size=1, max_size=8),
                    "description": CONTENT,
                    "parameters": st.just({"type": "object", "properties": {"x": {"type": "number"}}}),
                }
            ),
        }
    ),
    max_size=3,
)


@pytest.mark.parametrize("name", sorted(FOLDERS))
@FAST
@given(
    conversation=st.lists(st.tuples(st.sampled_from(ROLES), CONTENT), max_size=5),
    tools=TOOL_SPECS,
    add_generation_prompt=st.booleans(),
)
def test_apply_chat_template_is_rlruns_render(name, conversation, tools, add_generation_prompt):
    assume(conversation)  # transformers refuses an empty conversation
    hf, ours = HF[name], RLRUN[name]
    messages = [_message(role, content) for role, content in conversation]
    expected = render_chat(
        ours, [ChatMessage(role, content) for role, content in conversation], add_generation_prompt, tools
    )
    rendered = hf.apply_chat_template(
        messages,
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )
    assert rendered == expected
    text = hf.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert hf.encode(text, add_special_tokens=False) == expected


def test_the_template_writes_earlier_tool_calls_and_a_developer_message_as_rlrun_does():
    hf, ours = HF["char"], RLRUN["char"]
    calls = [
        {"id": "a", "type": "function", "function": {"name": "get", "arguments": {"city": "Paris", "n": 2}}},
        {"id": "b", "type": "function", "function": {"name": "put", "arguments": {}}},
    ]
    for content in ("", "let me look"):
        messages = [
            _message("developer", "be brief"),
            _message("user", "weather?"),
            {"role": "assistant", "content": content, "tool_calls": calls},
            _message("tool", "sunny"),
        ]
        written = calls_text(
            [
                {
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.dumps(c["function"]["arguments"]),
                    }
                }
                for c in calls
            ]
        )
        expected = (
            ours.render_message("system", "be brief")
            + ours.render_message("user", "weather?")
            + ours.render_message("assistant", f"{content}\n{written}" if content else written)
            + ours.render_message("tool", "sunny")
            + ours.message_header("assistant")
        )
        assert (
            hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            == expected
        )
    with pytest.raises(Exception, match="unknown chat role narrator"):
        hf.apply_chat_template([_message("narrator", "x")], tokenize=False)


def test_rlrun_reads_only_tokenizer_folders_and_any_other_hugging_face_folder_too(tmp_path):
    with pytest.raises(ValueError, match="tokenizer folder"):
        load_tokenizer(REPO / "pyproject.toml")
    assert load_tokenizer(FOLDERS["char"] / "tokenizer.json").encode("ab") == RLRUN["char"].encode("ab")
    byte_level_tokenizer("<|im_end|>", ["<|im_start|>"], WITHOUT_TOOLS).save_pretrained(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), HFTokenizer)
