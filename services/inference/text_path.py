"""The InferenceService's text-level path: chat messages and text in, the token ids training
needs out, so that an env-server needs no tokenizer of its own (proto/rlrun/v1/inference.proto:
GenerateChat, RenderChat, Tokenize, Detokenize). Rendering is concatenative (one delta per
message, rlrun.common.tokenizer), so each rendered message is exactly a Trace node's
token_ids. The servicer is the gRPC shell around this."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import ROLES, ChatMessage, Tokenizer
from rlrun.common.wire.inference import ChatCompletion, Completion, RenderedChat, check_token_ids
from rlrun.common.wire.plan import TokenizerInfo
from rlrun.common.wire.sampling import SamplingParams


class TextPath:
    def __init__(self, tokenizer: Tokenizer, info: TokenizerInfo):
        self.tokenizer = tokenizer
        self.info = info

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> RenderedChat:
        if not messages:
            raise RequestError("messages", "messages must not be empty")
        rendered = []
        for i, message in enumerate(messages):
            if message.role not in ROLES:
                raise RequestError(f"messages[{i}].role", f"role {message.role!r} is not one of {ROLES}")
            rendered.append(self.tokenizer.render_message(message.role, message.content))
        header = self.tokenizer.message_header("assistant") if add_generation_prompt else []
        return RenderedChat(rendered, header)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool) -> str:
        for i, token in enumerate(token_ids):
            if not 0 <= token < self.tokenizer.vocab_size:
                raise RequestError(
                    f"token_ids[{i}]",
                    f"token_ids[{i}] = {token} is outside the vocabulary [0, {self.tokenizer.vocab_size})",
                )
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def chat_sampling(
        self, params: SamplingParams, prompt: Sequence[int], max_model_len: int
    ) -> SamplingParams:
        """The request's sampling with the chat format's end tokens as stop tokens and
        max_tokens cut to the room the context has left; a prompt that leaves no room is refused."""
        check_token_ids(prompt, "messages", self.tokenizer.vocab_size, max_model_len - 1)
        return dataclasses.replace(
            params.with_stop_tokens(self.info.stop_token_ids),
            max_tokens=min(params.max_tokens, max_model_len - len(prompt)),
        )

    def chat_completion(self, completion: Completion) -> ChatCompletion:
        return ChatCompletion(
            completion, self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        )
