"""The in-repo character tokenizer: stable ids, round trips, concatenative chat rendering."""

import hashlib
from pathlib import Path

import pytest

from rlrun.common.hermes import tools_prompt
from rlrun.common.tokenizer import CharTokenizer, ChatMessage, load_tokenizer, render_chat

from ...support.byte_level import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[3]
CHAR = REPO / "configs/tokenizer/char.json"


def test_ids_are_stable():
    tok = CharTokenizer.from_file(CHAR)
    assert (tok.vocab_size, tok.pad_token_id, tok.eos_token_id) == (102, 0, 1)
    assert tok.encode("abc") == [71, 72, 73]
    # Any change to the shipped vocabulary breaks every saved checkpoint: pin its content.
    assert hashlib.sha256(CHAR.read_bytes()).hexdigest()[:12] == "4e947784e724"
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
        load_tokenizer(REPO / "configs/tokenizer/missing.json")
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
