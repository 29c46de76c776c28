"""InfoNCE (`bench.losses.infonce`): accuracy where the loss is tiny, against mpmath."""

from __future__ import annotations

import mpmath
import torch
import torch.nn.functional as F

from bench.losses.infonce import InfoNCELoss


def test_infonce_is_accurate_where_the_loss_is_tiny():
    """Well-separated classes at a low temperature: per-pair losses ~1e-20, checked at 50 digits."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(4).repeat_interleave(3)
    x = torch.eye(4, dtype=torch.float64)[y] + 0.05 * torch.randn(12, 4, generator=g, dtype=torch.float64)
    tau = 0.02
    loss = InfoNCELoss(temperature=tau)
    own = float(loss(x, y))
    mpmath.mp.dps = 50
    xn = F.normalize(x, dim=1)
    sim = (xn @ xn.T).tolist()
    terms = []
    for a in range(12):
        for p in range(12):
            if a != p and y[a] == y[p]:
                s = sum(
                    mpmath.exp((mpmath.mpf(sim[a][n]) - mpmath.mpf(sim[a][p])) / tau) for n in range(12) if y[n] != y[a]
                )
                terms.append(mpmath.log1p(s))
    reference = sum(terms) / len(terms)
    assert 0 < reference < 1e-12
    assert abs(own - float(reference)) <= 1e-12 * float(reference)
