from __future__ import annotations

import pytest

from rlrun.env_server.sdk.scoring import exact_match, levenshtein, similarity


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("", "", 0),
        ("abc", "", 3),
        ("kitten", "sitting", 3),
        ("abc", "cba", 2),
        ("abcd", "abdc", 2),
        ("flaw", "lawn", 2),
        ("same", "same", 0),
    ],
)
def test_levenshtein_on_hand_made_cases(a, b, distance):
    assert levenshtein(a, b) == distance
    assert levenshtein(b, a) == distance


@pytest.mark.parametrize(
    ("answer", "target", "score"),
    [
        ("abc", "abc", 1.0),
        ("", "", 1.0),
        ("", "abc", 0.0),
        ("cba", "abc", 1 - 2 / 3),
        ("abc", "abcd", 0.75),
        ("abcdef", "abc", 0.5),
        ("xyz", "abc", 0.0),
    ],
)
def test_similarity_is_one_minus_the_normalised_distance(answer, target, score):
    assert similarity(answer, target) == pytest.approx(score)


@pytest.mark.parametrize(
    ("answer", "target", "score"), [(" 42 ", "42", 1.0), ("42", "43", 0.0), ("", "0", 0.0), ("-7", "-7", 1.0)]
)
def test_exact_match(answer, target, score):
    assert exact_match(answer, target) == score
