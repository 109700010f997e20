"""Every sample alone at every degree: the rows planners seed from and the lower bound starts at.

A sample alone in a micro-batch of degree d costs what it adds to a micro-batch
(`CostModel.marginal_times`) at the least recompute level at which it fits (`CostModel.levels`),
without g and the collectives' fixed latency: what no plan can run it faster than at d.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..vocabulary.samples import Sample
from .cost import CostModel, tokens_array
from .micro_batch import LEVEL_EPS


def sequence_times(cost: CostModel, samples: Sequence[Sample], every_split: bool = False) -> np.ndarray:
    """Array [degree index, sample] of a sample alone at each of `cost.degrees`, at the degree's
    split (`SplitCatalogue.split`; `every_split`: the least over every split the catalogue offers,
    for bounds, found among `fastest_candidates`); inf where it does not fit."""
    s, q = tokens_array(samples), cost.units(samples)
    out = np.full((len(cost.degrees), len(s)), np.inf)
    for i, d in enumerate(cost.degrees):
        parts = cost.fastest_candidates(d) if every_split else [cost.catalogue.split(d)]
        out[i] = np.min([alone(cost, s, q, d, cp) for cp in parts], axis=0)
    return out


def alone(cost: CostModel, s: np.ndarray, q: np.ndarray, degree: int, cp: int) -> np.ndarray:
    """Samples of `s` tokens and `q` attention units, each alone at this degree and split, at its
    least recompute level; inf where none fits."""
    need = np.maximum(cost.activation_bytes(s, degree, 0.0, cp), LEVEL_EPS)
    levels = np.maximum(cost.levels(need, degree, cp), 0.0)
    return np.where(levels <= 1.0, cost.marginal_times(s, q, degree, levels, cp), np.inf)
