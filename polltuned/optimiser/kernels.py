"""GP kernel pieces for the encoded knob space (scikit-learn kernel API, used through skopt's GPR).

Why an additive part: with 20-30 noisy windows over six knobs a full ARD Matern kernel has to learn
how every knob matters from points that change several knobs at once, and it often explains a
real effect away as noise or gives it to the wrong knob. Most of what the polling knobs do is a
main effect per knob (busy polling's saturating gain, deferral's penalty, a timer_migration step),
so the surrogate is ``C_a x sum_knob Matern(knob's own columns) + C_f x Matern(all columns) +
white noise``: the additive part pools the evidence per knob across every configuration that set
it, the full part keeps interactions (deferral that only pays with busy polling, colocation).

:class:`OnColumns` restricts a kernel to some columns of the input; scikit-learn has no such
wrapper, so it is written here against the Kernel interface (hyper-parameters are the wrapped
kernel's, prefixed ``kernel__``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.gaussian_process.kernels import Hyperparameter, Kernel


class OnColumns(Kernel):  # type: ignore[misc]
    """``kernel`` applied to ``columns`` of X only."""

    def __init__(self, kernel: Any, columns: tuple[int, ...]) -> None:
        self.kernel = kernel
        self.columns = columns  # kept as given: scikit-learn's clone() checks identity

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params: dict[str, Any] = {"kernel": self.kernel, "columns": self.columns}
        if deep:
            for k, v in self.kernel.get_params().items():
                params["kernel__" + k] = v
        return params

    @property
    def hyperparameters(self) -> list[Hyperparameter]:
        return [Hyperparameter("kernel__" + h.name, h.value_type, h.bounds, h.n_elements, h.fixed)
                for h in self.kernel.hyperparameters]

    @property
    def theta(self) -> np.ndarray:
        return np.asarray(self.kernel.theta)

    @theta.setter
    def theta(self, theta: np.ndarray) -> None:
        self.kernel.theta = theta

    @property
    def bounds(self) -> np.ndarray:
        return np.asarray(self.kernel.bounds)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OnColumns) and self.columns == other.columns
                and self.kernel == other.kernel)

    def __hash__(self) -> int:
        return hash((self.columns, repr(self.kernel)))

    def _pick(self, X: np.ndarray | None) -> np.ndarray | None:
        if X is None:
            return None
        return np.asarray(X)[:, [int(c) for c in self.columns]]

    def __call__(self, X: np.ndarray, Y: np.ndarray | None = None, eval_gradient: bool = False) -> Any:
        if eval_gradient and Y is not None:
            raise ValueError("gradient only available when Y is None")
        return self.kernel(self._pick(X), self._pick(Y), eval_gradient=eval_gradient)

    def diag(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.kernel.diag(self._pick(X)))

    def is_stationary(self) -> bool:
        return bool(self.kernel.is_stationary())

    @property
    def requires_vector_input(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"{self.kernel!r}@{list(self.columns)}"


def additive_plus_full(groups: Sequence[tuple[int, ...]], width: int, noise_level: float,
                       noise_bounds: tuple[float, float]) -> Any:
    """The surrogate's kernel: one Matern per knob on its own columns (summed, one amplitude), a
    full ARD Matern for interactions, and white noise around the measured level."""
    # scikit-learn's kernel classes for the body; skopt's Sum/WhiteKernel at the top, which is what
    # skopt's GaussianProcessRegressor looks for to drop the noise term from predictions
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern
    from skopt.learning.gaussian_process.kernels import Sum, WhiteKernel

    parts = [OnColumns(Matern(length_scale=np.ones(len(g)), length_scale_bounds=(0.05, 1.0), nu=2.5), g)
             for g in groups]
    additive: Any = parts[0]
    for p in parts[1:]:
        additive = additive + p
    full = Matern(length_scale=np.ones(width), length_scale_bounds=(0.05, 1.0), nu=2.5)
    body = ConstantKernel(1.0, (0.01, 1000.0)) * additive + ConstantKernel(0.3, (1e-3, 1000.0)) * full
    return Sum(body, WhiteKernel(noise_level=noise_level, noise_level_bounds=noise_bounds))


#: the two ways the contextual surrogate J(knobs, context) combines knobs and context
CONTEXT_KERNELS = ("product", "sum")


def contextual(groups: Sequence[tuple[int, ...]], width: int, ctx_cols: tuple[int, ...], noise_level: float,
               noise_bounds: tuple[float, float], mode: str = "product") -> Any:
    """The surrogate's kernel over knobs (columns ``0..width-1``) plus context columns ``ctx_cols``.

    * ``"product"``: ``(C_a x sum_knob Matern + C_f x Matern(knobs)) x Matern(context, ARD)`` — a
      knob's effect is shared between loads only as far as the context's length scale says (a long
      learnt length scale: the context does not matter; a short one: each load has its own optimum);
    * ``"sum"``: the additive part over the knobs as without context, and the full ARD Matern over
      the knobs *and* the context dimensions (only the interaction part sees the load).
    """
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern
    from skopt.learning.gaussian_process.kernels import Sum, WhiteKernel

    if mode not in CONTEXT_KERNELS:
        raise ValueError(f"context kernel {mode!r}: choose one of {', '.join(CONTEXT_KERNELS)}")
    knob_cols = tuple(range(width))
    parts = [OnColumns(Matern(length_scale=np.ones(len(g)), length_scale_bounds=(0.05, 1.0), nu=2.5), g)
             for g in groups]
    additive: Any = parts[0]
    for p in parts[1:]:
        additive = additive + p
    if mode == "product":
        full = OnColumns(Matern(length_scale=np.ones(width), length_scale_bounds=(0.05, 1.0), nu=2.5), knob_cols)
        knobs = ConstantKernel(1.0, (0.01, 1000.0)) * additive + ConstantKernel(0.3, (1e-3, 1000.0)) * full
        ctx = OnColumns(Matern(length_scale=np.ones(len(ctx_cols)), length_scale_bounds=(0.05, 20.0), nu=2.5),
                        ctx_cols)
        body = knobs * ctx
    else:
        cols = knob_cols + tuple(ctx_cols)
        full = OnColumns(Matern(length_scale=np.ones(len(cols)), length_scale_bounds=(0.05, 20.0), nu=2.5), cols)
        body = ConstantKernel(1.0, (0.01, 1000.0)) * additive + ConstantKernel(0.3, (1e-3, 1000.0)) * full
    return Sum(body, WhiteKernel(noise_level=noise_level, noise_level_bounds=noise_bounds))
