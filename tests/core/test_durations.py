import doctest

import pytest

from queue_app.core import durations


def test_durations_doctests_pass():
    result = doctest.testmod(durations)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 1.5 s ", 1.5),
        (".25", 0.25),
        (3, 3.0),
    ],
)
def test_parse_accepts_numbers_with_units(text, seconds):
    assert durations.parse(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-1s", "1e3", "ms", "5 minutes", "nan", True])
def test_parse_refuses_anything_else_and_says_what_it_accepts(text):
    with pytest.raises(ValueError, match="invalid duration"):
        durations.parse(text)


def test_format_picks_a_readable_unit():
    assert [durations.format(s) for s in (0.25, 12.34, 245, 7860)] == ["250ms", "12.3s", "4m05s", "2h11m"]
