"""FedBNR's forgetting on a shared time base: :class:`~streamfed.core.discount.Discount`, which moved to the core
(FSGP forgets the same way); re-exported here so existing imports keep working.

>>> Discount(3600.0).factor(0.0, 3600.0)
0.5
"""

from __future__ import annotations

from streamfed.core.discount import Discount

__all__ = ["Discount"]
