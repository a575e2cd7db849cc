"""Built-in harnesses: single-turn, multi-turn with user feedback, tool calling."""

from rlrun.env_server.harnesses.multi_turn import MultiTurnHarness
from rlrun.env_server.harnesses.single_turn import SingleTurnHarness
from rlrun.env_server.harnesses.tool_calling import ToolCallingHarness

__all__ = ["MultiTurnHarness", "SingleTurnHarness", "ToolCallingHarness"]
