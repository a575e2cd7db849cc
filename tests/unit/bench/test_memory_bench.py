"""`rlrun bench memory` measures what a round keeps from the round at which a process tree stops
changing size: a worker the elastic pool starts is a process, not a leak."""

import pytest

from rlrun.bench.memory import steady_round


@pytest.mark.parametrize(
    ("processes", "round_"),
    [
        ([3, 3, 3, 3], 2),  # never changes: round 2, the baseline after the first round's set-up
        ([2, 3, 4, 5, 5, 5], 4),  # the pool grows until round 4
        ([2, 2, 2, 2, 3], 5),  # a change at the last round: only the last round is steady
        ([4, 5, 4, 4], 3),  # a shrink counts as a change too
    ],
)
def test_the_steady_round_is_the_first_after_the_last_change_of_processes(processes, round_):
    assert steady_round(processes) == round_
