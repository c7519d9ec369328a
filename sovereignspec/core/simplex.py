"""A derivative-free minimiser for the calibration's few coefficients (pure, numpy only)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def nelder_mead(f: Callable[[Array], float], x0: Array, step: float = 0.5, iters: int = 400) -> Array:
    """Minimise `f` from `x0` (the textbook method: reflect, expand, contract, shrink)."""
    dim = len(x0)
    simplex = [x0] + [x0 + step * np.eye(dim)[i] for i in range(dim)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) <= 1e-14 * (1.0 + abs(values[0])):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (worst - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best + 0.5 * (x - best) for x in simplex]
                values = [f(x) for x in simplex]
    return np.asarray(simplex[int(np.argmin(values))], dtype=np.float64)
