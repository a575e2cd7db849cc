"""Built-in harnesses: single-turn, multi-turn with user feedback, tool calling, multi-agent turns."""

from rlrun.env_server.sdk.harnesses.multi_turn import MultiTurnHarness
from rlrun.env_server.sdk.harnesses.single_turn import SingleTurnHarness
from rlrun.env_server.sdk.harnesses.tool_calling import ToolCallingHarness
from rlrun.env_server.sdk.harnesses.turns import TurnHarness

__all__ = ["MultiTurnHarness", "SingleTurnHarness", "ToolCallingHarness", "TurnHarness"]
