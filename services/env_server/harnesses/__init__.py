"""Built-in harnesses: single-turn, multi-turn with user feedback, tool calling, multi-agent turns."""

from rlrun.env_server.harnesses.multi_turn import MultiTurnHarness
from rlrun.env_server.harnesses.single_turn import SingleTurnHarness
from rlrun.env_server.harnesses.tool_calling import ToolCallingHarness
from rlrun.env_server.harnesses.turns import TurnHarness

__all__ = ["MultiTurnHarness", "SingleTurnHarness", "ToolCallingHarness", "TurnHarness"]
