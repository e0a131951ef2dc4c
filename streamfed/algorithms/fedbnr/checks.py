"""What FedBNR refuses before anything changes: a hyperparameter that is not finite and positive, a target
whose square is not finite (it would overflow `q`), features times targets that overflow. Shared by the
client, the server, the River estimator and personalised FedBNR.

>>> check_positive("sigma", 0.5), check_target(2)
(0.5, 2.0)
>>> check_target(float("inf"))
Traceback (most recent call last):
...
ValueError: target must be finite (and |y| < 1e154), got inf
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["all_finite_products", "all_finite_squares", "check_positive", "check_target"]


def all_finite_squares(v: np.ndarray) -> bool:
    """Every `v²` finite (so a target cannot overflow `q`), without an overflow warning."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.all(np.isfinite(v * v)))


def all_finite_products(a: np.ndarray, b: np.ndarray) -> bool:
    """Every `a·b` finite (features times targets), without an overflow warning."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.all(np.isfinite(a * b)))


def check_positive(name: str, value: float) -> float:
    """`value` as a float; `ValueError` naming `name` unless it is finite and > 0."""
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def check_target(y: Any) -> float:
    """`y` as a float; `ValueError` for a non-number or one whose square is not finite."""
    try:
        y = float(y)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"target must be a number, got {y!r}") from exc
    if not math.isfinite(y * y):  # y² enters q: reject what would overflow it too
        raise ValueError(f"target must be finite (and |y| < 1e154), got {y!r}")
    return y
