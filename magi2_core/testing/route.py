"""Router inputs with planted ties: the rows where the routing contract's ids clause is hardest.

Each head gets pairs of experts whose router rows are equal or nearly equal, with equal bias, so
their selection scores tie on every token: exactly (equal rows: the lower id must come first), far
inside the contract's gap (any order is allowed), or around it (``ROUTE_GAP``: across tokens some rows
are clear and must be exact, some are near-ties). Where a pair sits relative to the k-th place varies
from token to token, so ties land inside the top-k, across its boundary and below it.
"""

from __future__ import annotations

import torch

__all__ = ["PLANTED_SPREADS", "plant_near_ties"]

# Relative spread of a planted twin's router row: 0 (an exact twin), far below the gap, around it.
# With x ~ N(0, 1) and rows ~ N(0, 1/d) the logit gap is ~ spread · N(0, 1) and the sigmoid score gap
# at most a quarter of it, so 5e-5 puts the score gaps of a pair around the contract's 1e-5.
PLANTED_SPREADS = (0.0, 1e-7, 5e-5)


def plant_near_ties(
    g: torch.Generator, router_weight: torch.Tensor, bias: torch.Tensor | None, *, num_heads: int, every: int = 4
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Copies of ``router_weight [Hl·E, d]`` and ``bias`` with a twin planted for every ``every``-th expert.

    Expert ``a`` (``a % every == 0``, ``a + 1 < E``) of each head gets the twin ``a + 1``: its row is
    ``w[a] + spread · n`` (``n`` a fresh draw of the row's scale) and its bias ``bias[a]``; the spreads
    cycle through :data:`PLANTED_SPREADS` over the heads' pairs. Drawn on the CPU from ``g``.
    """
    w = router_weight.detach().cpu().clone()
    b = None if bias is None else bias.detach().cpu().clone()
    f, d = w.shape
    e = f // num_heads
    scale = float(w.double().std()) if w.numel() > 1 else 1.0
    pair = 0
    for h in range(num_heads):
        for a in range(0, e - 1, every):
            spread = PLANTED_SPREADS[pair % len(PLANTED_SPREADS)]
            pair += 1
            row = h * e + a
            noise = torch.randn(d, generator=g, dtype=torch.float64) * scale * spread
            w[row + 1] = (w[row].double() + noise).float()
            if b is not None:
                b[row + 1] = b[row]
    return w.to(router_weight.device), None if b is None else b.to(router_weight.device)
