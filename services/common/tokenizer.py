"""Tokenizers with chat rendering that is concatenative: a conversation's tokens are the
concatenation of its messages' tokens. Harnesses rely on that to extend earlier turns
exactly, without ever re-rendering the past.

Two kinds: the in-repo character tokenizers (configs/tokenizer/char/ and lowercase/: stable
ids, no download) and the tokenizer of a local Hugging Face checkpoint directory.

A character tokenizer is a Hugging Face tokenizer folder too, the one source of its ids:
`tokenizer.json` (a WordLevel vocabulary of the specials then one entry per character, a
pre-tokenizer that splits every character, `?` for any character outside the vocabulary) and
`tokenizer_config.json` (its specials and a chat template that writes rlrun's chat format,
tools included). `transformers.AutoTokenizer.from_pretrained(folder)` loads it and gives the
same ids as `CharTokenizer` for any text, and `apply_chat_template` the ids of `render_chat`;
one difference is Hugging Face's own: text that spells a special (`<|end|>`) is that special
token to a Hugging Face tokenizer and characters to rlrun, whose messages cannot forge the
chat format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlrun.common.hermes import tools_prompt

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


class Tokenizer(Protocol):
    vocab_size: int
    eos_token_id: int
    pad_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def unknown(self, text: str) -> str:
        """What of `text` it cannot encode (each character, or for a word-level vocabulary each
        piece, once, in order): "" when it encodes all of it. `encode` turns such text into its
        unknown token instead of failing."""
        ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def message_header(self, role: str) -> list[int]:
        """Tokens that open a message of `role` (for assistant: the generation prompt)."""
        ...

    def render_message(self, role: str, content: str) -> list[int]:
        """Header + content + end-of-message: one message's whole token delta."""
        ...

    def render_tools(self, tools: Sequence[dict], system: str | None) -> list[int]:
        """The system message that offers `tools` (OpenAI's function tools), with the
        conversation's own system message `system` where it has one."""
        ...

    @property
    def stop_token_ids(self) -> list[int]: ...


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[ChatMessage],
    add_generation_prompt: bool = True,
    tools: Sequence[dict] = (),
) -> list[int]:
    ids: list[int] = []
    if tools:
        system = messages[0].content if messages and messages[0].role == "system" else None
        ids += tokenizer.render_tools(tools, system)
        messages = messages[1:] if system is not None else messages
    for message in messages:
        ids += tokenizer.render_message(message.role, message.content)
    if add_generation_prompt:
        ids += tokenizer.message_header("assistant")
    return ids


def _tools_prompt(tools: Sequence[dict], system: str | None) -> str:
    return f"{system}\n\n{tools_prompt(tools)}" if system else tools_prompt(tools)


class CharTokenizer:
    """One token per character of a fixed alphabet plus role and end specials.

    The file lists specials then characters; ids are positions in that list, so they are
    stable across runs and machines.
    """

    def __init__(self, specials: list[str], chars: list[str], unk: str = "?"):
        self.specials = specials
        self.chars = chars
        self.id_to_token = specials + chars
        self.token_to_id = {tok: i for i, tok in enumerate(self.id_to_token)}
        if len(self.token_to_id) != len(self.id_to_token):
            raise ValueError("tokenizer vocabulary has duplicate entries")
        self.vocab_size = len(self.id_to_token)
        self.pad_token_id = self.token_to_id["<pad>"]
        self.eos_token_id = self.token_to_id["<|end|>"]
        self._unk_id = self.token_to_id[unk]
        self._special_ids = set(range(len(specials)))

    @classmethod
    def from_file(cls, path: str | Path) -> CharTokenizer:
        """The character tokenizer of a Hugging Face tokenizer folder (or its tokenizer.json)."""
        spec = read_char_tokenizer(path)
        if spec is None:
            raise ValueError(f"{path}: not a character tokenizer (see rlrun.common.tokenizer)")
        return cls(*spec)

    def to_dict(self) -> dict:
        return {"type": "char", "specials": self.specials, "chars": self.chars}

    def encode(self, text: str) -> list[int]:
        return [self.token_to_id.get(ch, self._unk_id) for ch in text]

    def unknown(self, text: str) -> str:
        return "".join(dict.fromkeys(ch for ch in text if ch not in self.token_to_id))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            if skip_special_tokens and i in self._special_ids:
                continue
            out.append(self.id_to_token[i] if 0 <= i < self.vocab_size else "")
        return "".join(out)

    def message_header(self, role: str) -> list[int]:
        if role not in ROLES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {ROLES}")
        return [self.token_to_id[f"<|{role}|>"]]

    def render_message(self, role: str, content: str) -> list[int]:
        return self.message_header(role) + self.encode(content) + [self.eos_token_id]

    def render_tools(self, tools: Sequence[dict], system: str | None) -> list[int]:
        return self.render_message("system", _tools_prompt(tools, system))

    @property
    def stop_token_ids(self) -> list[int]:
        return [self.eos_token_id]


class HFTokenizer:
    """A local checkpoint's tokenizer, rendered one message at a time with its chat template."""

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.vocab_size = len(self._tok)
        self.eos_token_id = self._tok.eos_token_id
        self.pad_token_id = (
            self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_token_id
        )
        self._header_cache: dict[str, list[int]] = {}
        self._offers_tools: bool | None = None
        """Whether the chat template renders `tools` (found on first use)."""

    @property
    def hf_tokenizer(self):
        """The transformers tokenizer itself (structured outputs compile grammars over it)."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def unknown(self, text: str) -> str:
        """What it maps to its unknown token; a byte-level tokenizer (GPT-2's, Qwen's) has
        none and encodes everything."""
        unk = self._tok.unk_token_id
        if unk is None:
            return ""
        encoded = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        pieces = (
            text[start:end]
            for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)
            if token == unk and text[start:end] != self._tok.unk_token
        )
        return " ".join(dict.fromkeys(pieces))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _template(self, messages: list[dict], add_generation_prompt: bool, tools=None) -> list[int]:
        out = self._tok.apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=add_generation_prompt
        )
        # Newer transformers answer a BatchEncoding (a Mapping, not a dict); older ones a list.
        return list(out["input_ids"] if isinstance(out, Mapping) else out)

    def message_header(self, role: str) -> list[int]:
        if role != "assistant":
            raise ValueError("HF chat templates only expose the assistant header (the generation prompt)")
        if role not in self._header_cache:
            with_prompt = self._template([{"role": "user", "content": "x"}], True)
            without = self._template([{"role": "user", "content": "x"}], False)
            self._header_cache[role] = with_prompt[len(without) :]
        return self._header_cache[role]

    def render_message(self, role: str, content: str) -> list[int]:
        return self._template([{"role": role, "content": content}], False)

    def render_tools(self, tools: Sequence[dict], system: str | None) -> list[int]:
        """The template's own way of offering tools; a template that ignores them gets them as
        the system message the char tokenizer writes."""
        message = [{"role": "system", "content": system or ""}]
        if self._offers_tools is None:
            self._offers_tools = self._template(message, False, tools=list(tools)) != self._template(
                message, False
            )
        if self._offers_tools:
            return self._template(message, False, tools=list(tools))
        return self.render_message("system", _tools_prompt(tools, system))

    @property
    def stop_token_ids(self) -> list[int]:
        return [self.eos_token_id]


def _tokenizer_json(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        return path / "tokenizer.json"
    if path.name != "tokenizer.json":
        raise ValueError(
            f"{path}: a tokenizer is a Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json)"
        )
    return path


def read_char_tokenizer(path: str | Path) -> tuple[list[str], list[str], str] | None:
    """(specials, chars, unk) of the folder's tokenizer.json when it is a character tokenizer:
    a WordLevel vocabulary whose special tokens come first and whose other entries are one
    character each; None for any other tokenizer."""
    spec = json.loads(_tokenizer_json(path).read_text())
    model = spec.get("model") or {}
    if model.get("type") != "WordLevel":
        return None
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError(f"{path}: the vocabulary's ids are not 0..{len(by_id) - 1}")
    special = {token["content"] for token in spec.get("added_tokens", ()) if token.get("special")}
    tokens = [token for token, _ in by_id]
    count = len(special)
    if set(tokens[:count]) != special or any(len(token) != 1 for token in tokens[count:]):
        return None
    return tokens[:count], tokens[count:], model.get("unk_token") or "?"


def load_tokenizer(tokenizer_path: str | Path | None, checkpoint_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer folder when given (a character tokenizer, or any other Hugging Face
    tokenizer), else the checkpoint directory's own tokenizer."""
    if tokenizer_path is not None:
        path = Path(tokenizer_path)
        if not path.exists():
            raise FileNotFoundError(f"tokenizer {path} does not exist")
        if read_char_tokenizer(path) is not None:
            return CharTokenizer.from_file(path)
        return HFTokenizer(path if path.is_dir() else path.parent)
    if checkpoint_dir is None:
        raise ValueError("no tokenizer: set model.tokenizer or model.path")
    return HFTokenizer(checkpoint_dir)
