"""The message graph of one member's rollout, built node by node.

Every message is one node holding only its own token delta. A node's parent is the message
it follows; a branch is a root-to-leaf path. Extending the conversation adds a child of the
latest node, so later turns extend the earlier tokens exactly. Rewriting history adds a child
of an earlier node, which opens a new branch and keeps the old one intact.
"""

from __future__ import annotations

from rlrun.common.wire.trace import Branch, MessageNode, Role


class TraceBuilder:
    def __init__(self) -> None:
        self.nodes: list[MessageNode] = []
        self._by_id: dict[str, MessageNode] = {}
        self._has_children: set[str] = set()

    def add(
        self,
        role: Role,
        token_ids: list[int],
        sampled_mask: list[bool],
        logprobs: list[float],
        parent: str | None,
        content: str = "",
        is_observation: bool = False,
        parse_error: bool = False,
    ) -> str:
        """Appends a node under `parent` (None for a new root); returns its id. `parse_error`
        quarantines the node: it stays in the history, but its tokens never train."""
        if len(sampled_mask) != len(token_ids):
            raise ValueError(f"sampled_mask has {len(sampled_mask)} entries for {len(token_ids)} tokens")
        if len(logprobs) != sum(sampled_mask):
            raise ValueError(f"{len(logprobs)} logprobs for {sum(sampled_mask)} sampled tokens")
        if parent is not None and parent not in self._by_id:
            raise KeyError(f"parent {parent!r} is not a node of this graph")
        node = MessageNode(
            id=f"n{len(self.nodes)}",
            role=role,
            token_ids=list(token_ids),
            sampled_mask=list(sampled_mask),
            logprobs=list(logprobs),
            parent=parent,
            content=content,
            is_observation=is_observation,
            parse_error=parse_error,
        )
        self.nodes.append(node)
        self._by_id[node.id] = node
        if parent is not None:
            self._has_children.add(parent)
        return node.id

    def node(self, node_id: str) -> MessageNode:
        return self._by_id[node_id]

    def path(self, node_id: str | None) -> list[str]:
        """Node ids from the root down to `node_id` (empty for None)."""
        path: list[str] = []
        while node_id is not None:
            path.append(node_id)
            node_id = self._by_id[node_id].parent
        return path[::-1]

    def tokens(self, node_id: str | None) -> list[int]:
        """The token sequence from the root through `node_id`: what the model sees there."""
        return [tok for nid in self.path(node_id) for tok in self._by_id[nid].token_ids]

    def branches(self) -> list[Branch]:
        """One branch per leaf, in the order the leaves were created."""
        return [Branch(node_ids=self.path(n.id)) for n in self.nodes if n.id not in self._has_children]
