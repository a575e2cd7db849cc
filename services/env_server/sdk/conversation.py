"""One member's side of a rollout at the token level: a message graph plus a cursor.

Rendering is concatenative (see rlrun.common.tokenizer): each message is rendered once, on
its own, into the node's token delta, and the model's prompt is the concatenation along the
cursor's branch plus the assistant header. Past turns are never re-rendered.
"""

from __future__ import annotations

from rlrun.common.tokenizer import ChatMessage, Tokenizer
from rlrun.common.wire.inference import Completion
from rlrun.common.wire.trace import Role
from rlrun.env_server.sdk.errors import PromptNotEncodable
from rlrun.env_server.sdk.trace_builder import TraceBuilder


class Conversation:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.graph = TraceBuilder()
        self.cursor: str | None = None
        """The node the next message follows (None before the first)."""
        self.completions: list[Completion] = []
        """Every completion added, in order."""
        self._tokens: list[int] = []

    @property
    def tokens(self) -> list[int]:
        """The token sequence along the cursor's branch."""
        return list(self._tokens)

    def _append(
        self,
        role: Role,
        token_ids: list[int],
        sampled_mask: list[bool],
        logprobs: list[float],
        content: str,
        is_observation: bool = False,
        parse_error: bool = False,
    ) -> str:
        self.cursor = self.graph.add(
            role, token_ids, sampled_mask, logprobs, self.cursor, content, is_observation, parse_error
        )
        self._tokens += token_ids
        return self.cursor

    def add_prompt(self, prompt: str, system: str | None = None) -> str:
        """The opening messages (system, if any, then user); they are not observations. A
        prompt the tokenizer cannot encode is refused (PromptNotEncodable)."""
        for role, text in (("system", system), ("user", prompt)):
            unknown = self.tokenizer.unknown(text) if text else ""
            if unknown:
                raise PromptNotEncodable(
                    f"the {role} prompt {text[:60]!r} holds characters the tokenizer cannot encode: "
                    f"{unknown!r} (it would read them as its unknown token)"
                )
        if system is not None:
            tokens = self.tokenizer.render_message("system", system)
            self._append("system", tokens, [False] * len(tokens), [], system)
        tokens = self.tokenizer.render_message("user", prompt)
        return self._append("user", tokens, [False] * len(tokens), [], prompt)

    def add_observation(self, role: Role, content: str) -> str:
        """A message the environment returns (user feedback, a tool result)."""
        tokens = self.tokenizer.render_message(role, content)
        return self._append(role, tokens, [False] * len(tokens), [], content, is_observation=True)

    def prompt_ids(self) -> list[int]:
        """What the model is given for the next assistant turn."""
        return self._tokens + self.tokenizer.message_header("assistant")

    def add_completion(self, completion: Completion, parse_error: bool = False) -> str:
        """The assistant node: the header (not sampled) then the sampled tokens, stop token included.
        `parse_error` marks a completion whose markup did not parse (its tokens never train)."""
        header = self.tokenizer.message_header("assistant")
        self.completions.append(completion)
        return self._append(
            "assistant",
            header + completion.token_ids,
            [False] * len(header) + [True] * len(completion.token_ids),
            completion.logprobs,
            self.tokenizer.decode(completion.token_ids),
            parse_error=parse_error,
        )

    def rewind(self, node_id: str | None) -> None:
        """Moves the cursor back to `node_id` (an ancestor of the cursor, or None for a new root):
        the next message forks a new branch there, and the current branch stays as it was."""
        if node_id is not None and node_id not in self.graph.path(self.cursor):
            raise ValueError(f"cannot rewind to {node_id!r}: it is not on the current branch")
        self.cursor = node_id
        self._tokens = self.graph.tokens(node_id)

    def messages(self) -> list[ChatMessage]:
        """The messages along the cursor's branch."""
        return [
            ChatMessage(self.graph.node(nid).role, self.graph.node(nid).content)
            for nid in self.graph.path(self.cursor)
        ]

    def last_text(self, role: Role = "assistant") -> str:
        """Content of the latest message of `role` on the current branch ("" when there is none)."""
        for nid in reversed(self.graph.path(self.cursor)):
            if self.graph.node(nid).role == role:
                return self.graph.node(nid).content
        return ""

    @property
    def policy_span(self) -> tuple[int, int]:
        """(lowest start, highest end) policy version over the completions; (0, 0) without any."""
        if not self.completions:
            return (0, 0)
        return (
            min(c.policy_version_start for c in self.completions),
            max(c.policy_version_end for c in self.completions),
        )

    @property
    def truncated(self) -> bool:
        return any(c.finish_reason == "length" for c in self.completions)
