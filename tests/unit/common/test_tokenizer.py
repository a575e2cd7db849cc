"""The in-repo character tokenizer: stable ids, round trips, concatenative chat rendering."""

import hashlib
from pathlib import Path

import pytest

from rlrun.common.tokenizer import CharTokenizer, ChatMessage, load_tokenizer, render_chat

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
