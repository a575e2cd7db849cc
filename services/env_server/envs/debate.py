"""debate: two debaters answer a question with a known answer; a judge picks the winner.

The questions are seeded and generated locally: which of two distinct two-digit numbers is
larger, asked as `max(37,52)` (answer `52`). Round 1 is a simultaneous slot: both debaters
commit an answer without seeing the other's. Each further round (`rounds` > 1) is a
sequential rebuttal, debater_a then debater_b, each seeing the other's public answers. Then
the judge speaks, having seen every public answer, and names the winner: `a`, `b` or `draw`.

Winner-take-all and zero-sum: the winner gets +1, the loser −1, the judge 0; a draw (or a
verdict that is none of the three) gives everyone 0. The seat the learner plays is recorded
in the traces' info as `learner_seat`.

Every member may be a model or a rule (a `rule` plan target):
- the judge's rule rules for the debater whose final answer is correct, a draw when both or
  neither are;
- a `train` debater's rule is the oracle: the correct answer (the warm start's demonstrations);
- a `fixed` debater's rule is a beatable opponent: correct with probability
  `opponent_accuracy`, else it names the smaller number; its draws are seeded by the task and
  the episode's place in its group, so every eval faces the same opponent.
"""

from __future__ import annotations

import random

from rlrun.common.wire.plan import PlanTarget
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import TurnHarness
from rlrun.env_server.sdk.multi_agent import MultiAgentEpisode, PublicMessage
from rlrun.env_server.sdk.task import Example, MemberScores, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset

DEBATER_A, DEBATER_B, JUDGE = "debater_a", "debater_b", "judge"
SEAT_NAMES = {DEBATER_A: "a", DEBATER_B: "b"}
"""How the debaters are named in what the others see and in the judge's verdict."""
DRAW = "draw"


def draw_question(rng: random.Random) -> Example:
    a, b = rng.sample(range(10, 100), 2)
    question = f"max({a},{b})"
    return Example(key=question, prompt=question, data={"numbers": [a, b], "answer": str(max(a, b))})


def debate_view(viewer: str, message: PublicMessage) -> str | None:
    """The debaters' answers, under their seat names, to everyone; the judge's verdict to no one."""
    if message.speaker == JUDGE:
        return None
    return f"{SEAT_NAMES[message.speaker]}: {message.text}"


def verdict(answers: dict[str, str], correct: str) -> str:
    """The rule judge: the seat name of the only debater whose answer is correct, else a draw."""
    right = [seat for seat, answer in answers.items() if answer.strip() == correct]
    return SEAT_NAMES[right[0]] if len(right) == 1 else DRAW


def outcome_rewards(judged: str) -> dict[str, float]:
    """Per debater: +1 for the winner, −1 for the loser; 0 each on a draw or an invalid verdict."""
    winner = next((seat for seat, name in SEAT_NAMES.items() if name == judged), None)
    return {seat: 0.0 if winner is None else 1.0 if seat == winner else -1.0 for seat in SEAT_NAMES}


class Debate(Environment):
    members = (DEBATER_A, DEBATER_B, JUDGE)

    def __init__(
        self,
        rounds: int = 1,
        opponent_accuracy: float = 0.5,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
    ):
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if not 0.0 <= opponent_accuracy <= 1.0:
            raise ValueError(f"opponent_accuracy must be in [0, 1], got {opponent_accuracy}")
        self.opponent_accuracy = opponent_accuracy
        self.seed = seed
        self.taskset = GeneratedTaskset(draw_question, seed, train_size, eval_size)
        schedule = [(DEBATER_A, DEBATER_B)] + [(DEBATER_A,), (DEBATER_B,)] * (rounds - 1) + [(JUDGE,)]
        self.harness = TurnHarness(schedule, seats=(DEBATER_A, DEBATER_B), view=debate_view)

    def member_prompt(self, task: Task, member: str) -> tuple[str, str | None]:
        return (f"judge {task.prompt}" if member == JUDGE else task.prompt), None

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]

    def rule_reply(self, task: Task, episode: MultiAgentEpisode, member: str, target: PlanTarget) -> str:
        if member == JUDGE:
            return verdict({seat: episode.public_answer(seat) for seat in SEAT_NAMES}, task.data["answer"])
        if target.role == "train":
            return self.reference_answer(task)
        rng = random.Random(f"{self.seed}:{task.split}:{task.idx}:{episode.index}:{member}")
        if rng.random() < self.opponent_accuracy:
            return self.reference_answer(task)
        return str(min(task.data["numbers"]))

    def score(self, task: Task, episode: Episode) -> MemberScores:
        assert isinstance(episode, MultiAgentEpisode)
        judged = episode.public_answer(JUDGE).strip()
        rewards = outcome_rewards(judged)
        scores = {
            seat: Score.of(
                "outcome", rewards[seat], correct=float(episode.public_answer(seat) == task.data["answer"])
            )
            for seat in SEAT_NAMES
        }
        scores[JUDGE] = Score.of("outcome", 0.0, valid_verdict=float(judged in (*SEAT_NAMES.values(), DRAW)))
        return MemberScores(scores)
