"""ng.einsum against torch.einsum: values and gradients on both devices."""
from __future__ import annotations

import numpy as np
import pytest

import numbagrad as ng
from conftest import matches_torch

torch = pytest.importorskip("torch")

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),                     # implicit output: ik
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),                                # the trace
    ("iij->j", [(3, 3, 2)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ijk,jl,lk->il", [(2, 3, 4), (3, 5), (5, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
    ("...ij->...ji", [(2, 2, 3, 4)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),   # a bilinear form
    ("ab,cd->", [(2, 3), (4, 5)]),
]


@pytest.mark.parametrize("equation, shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_torch(dev, equation, shapes):
    arrays = [np.random.default_rng(i).normal(size=s) for i, s in enumerate(shapes)]
    matches_torch(lambda *xs: ng.einsum(equation, *xs),
                  lambda *xs: torch.einsum(equation, *xs), arrays, dev=dev, name=equation,
                  rtol=1e-12)


def test_einsum_errors_name_the_problem():
    a, b = ng.tensor(np.ones((2, 3))), ng.tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match="einsum: index 'j' has size 3 in one operand and 4"):
        ng.einsum("ij,jk->ik", a, b)
    with pytest.raises(ValueError, match="names 2 operands, got 1"):
        ng.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match="'ijk' names 3 dims, its operand has 2"):
        ng.einsum("ijk->i", a)
    with pytest.raises(ValueError, match="output 'iz'"):
        ng.einsum("ij->iz", a)
    with pytest.raises(TypeError, match="einsum: the equation must be a string"):
        ng.einsum(a, b)
