"""The env-server and its environment SDK.

An environment is a taskset (seeded, generated), a harness (the loop that talks to the model,
tools and users) and a scorer. Write one by subclassing `Environment`:

    class MyEnv(Environment):
        def __init__(self, seed: int = 0):
            self.taskset = GeneratedTaskset(draw, seed)
            self.harness = SingleTurnHarness()

        def score(self, task: Task, episode: Episode) -> Score:
            return Score.of("correct", exact_match(episode.answer, task.data["answer"]))

and name it in the run config as a built-in id (rlrun.env_server.envs.registry) or as an import
path `package.module:MyEnv`. A multi-agent env sets `members`, drives MultiAgentEpisodes with
a TurnHarness and scores with MemberScores (see rlrun.env_server.sdk.multi_agent and the debate env).
"""

from rlrun.common.wire.inference import Completion
from rlrun.env_server.sdk.algorithms import AlgorithmContext, BranchResult, EnvAlgorithm, sampled_advantage
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import POLICY, Episode, generate_group
from rlrun.env_server.sdk.errors import InvalidModelOutput, ModelCallError, ToolError
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.harnesses import (
    MultiTurnHarness,
    SingleTurnHarness,
    ToolCallingHarness,
    TurnHarness,
)
from rlrun.env_server.sdk.models import Model
from rlrun.env_server.sdk.multi_agent import MultiAgentEpisode, PublicMessage, Slot
from rlrun.env_server.sdk.scoring import exact_match, levenshtein, similarity
from rlrun.env_server.sdk.task import Example, MemberScores, Score, Task
from rlrun.env_server.sdk.taskset import EVAL, TRAIN, GeneratedTaskset, Taskset

__all__ = [
    "EVAL",
    "POLICY",
    "TRAIN",
    "AlgorithmContext",
    "BranchResult",
    "Completion",
    "Conversation",
    "EnvAlgorithm",
    "Environment",
    "Episode",
    "Example",
    "GeneratedTaskset",
    "Harness",
    "InvalidModelOutput",
    "MemberScores",
    "Model",
    "ModelCallError",
    "MultiAgentEpisode",
    "MultiTurnHarness",
    "PublicMessage",
    "Score",
    "SingleTurnHarness",
    "Slot",
    "Task",
    "Taskset",
    "ToolCallingHarness",
    "ToolError",
    "TurnHarness",
    "exact_match",
    "generate_group",
    "levenshtein",
    "sampled_advantage",
    "similarity",
]
