"""`tests/helpers.pairwise`, the covering arrays behind the pairwise grids: every pair of values of every two axes
appears in some row, each row takes one value per axis, and it is smaller than the full product."""

import itertools

import pytest
from helpers import pairwise


@pytest.mark.parametrize("sizes", [(7, 3, 2, 2), (6, 3, 2, 2), (4, 3, 3), (5, 5, 5, 5), (2, 2, 2), (9, 10)])
def test_every_pair_is_covered(sizes):
    axes = [[f"{i}:{v}" for v in range(n)] for i, n in enumerate(sizes)]
    rows = pairwise(*axes)
    assert all(len(r) == len(axes) and all(v in axes[i] for i, v in enumerate(r)) for r in rows)
    for i, j in itertools.combinations(range(len(axes)), 2):
        assert set(itertools.product(axes[i], axes[j])) <= {(r[i], r[j]) for r in rows}, (i, j)
    full = 1
    for n in sizes:
        full *= n
    assert len(rows) <= full and (len(sizes) < 3 or len(rows) < full)
    assert pairwise(*axes) == rows  # deterministic


def test_the_model_reference_grid_shrinks_as_stated():
    assert len(pairwise(range(7), range(3), range(2), range(2))) == 22  # 84 in full
