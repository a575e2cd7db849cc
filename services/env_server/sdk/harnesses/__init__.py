"""Built-in harnesses: single-turn, multi-turn with user feedback, tool calling, sandbox tools,
multi-agent turns."""

from rlrun.env_server.sdk.harnesses.multi_turn import MultiTurnHarness
from rlrun.env_server.sdk.harnesses.sandbox_tools import SandboxToolHarness
from rlrun.env_server.sdk.harnesses.single_turn import SingleTurnHarness
from rlrun.env_server.sdk.harnesses.tool_calling import ToolCallingHarness
from rlrun.env_server.sdk.harnesses.turns import TurnHarness

__all__ = ["MultiTurnHarness", "SandboxToolHarness", "SingleTurnHarness", "ToolCallingHarness", "TurnHarness"]
