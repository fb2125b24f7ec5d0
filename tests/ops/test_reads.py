import doctest

from queue_app.ops import reads


def test_reads_doctests_pass():
    result = doctest.testmod(reads)
    assert result.attempted > 0
    assert result.failed == 0


def test_percentile_is_nearest_rank_so_p95_of_twenty_is_the_nineteenth():
    values = list(range(1, 21))
    assert reads.percentile(values, 0.95) == 19
    assert reads.percentile(values, 0.5) == 10
    assert reads.percentile([7], 0.95) == 7
