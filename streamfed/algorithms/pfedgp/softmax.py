"""The FedAvg baseline of pFedGP's evaluation: the same shared network with a softmax head (weights `W (C, D)`,
biases `b (C,)` at the end of the parameter vector), the whole of it averaged — no personal part. The client
is pFedGP's (budget, chunks, versions) with the GP replaced by `softmax(W g_θ(x) + b)` and the local update
by Adam steps on the mean cross-entropy of the budget.

>>> from streamfed.algorithms.urk.network import URKArch
>>> from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
>>> layout = Layout(URKArch(n_inputs=2, widths=(), n_omega=4), 0, 3 * 9)
>>> c = SoftmaxClient(layout, initial_theta(layout, 0), omega_of(layout, 0), n_classes=3, learn_kernel=False)
>>> c.predict(np.zeros(2)).round(3).tolist()  # a zero head: uniform
[0.333, 0.333, 0.333]
"""

from __future__ import annotations

import numpy as np

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.chunks import split_vector
from streamfed.algorithms.pfedgp.budget import ClassBudget
from streamfed.algorithms.pfedgp.client import PFedGPClient
from streamfed.algorithms.pfedgp.wire import chunk_update
from streamfed.core.durable import durable

__all__ = ["SoftmaxClient", "fit_softmax"]


def _head(client: PFedGPClient, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lay, C = client.layout, client.n_classes
    h = theta[lay.head_start:]
    return h[: C * lay.embed_dim].reshape(C, lay.embed_dim), h[C * lay.embed_dim:]


def fit_softmax(client: PFedGPClient, X: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Adam steps on the mean cross-entropy of `(X, y)` over the network and the head (torch); None when a step
    would leave finite numbers."""
    import torch

    from streamfed.algorithms.urk.training import features_t

    lay, C = client.layout, client.n_classes
    v = torch.tensor(client.theta, requires_grad=True)
    om, Xt, yt = torch.tensor(client.omega), torch.tensor(X), torch.tensor(np.asarray(y, dtype=np.int64))
    opt = torch.optim.Adam([v], lr=client.learning_rate)
    for _ in range(client.fit_steps):
        opt.zero_grad()
        E = features_t(v[: lay.n_net], lay.arch, om, Xt)
        h = v[lay.head_start:]
        logits = E @ h[: C * lay.embed_dim].reshape(C, lay.embed_dim).T + h[C * lay.embed_dim:]
        loss = torch.nn.functional.cross_entropy(logits, yt)
        if not torch.isfinite(loss):
            return None
        loss.backward()
        opt.step()
    out = v.detach().numpy().copy()
    return out if np.all(np.isfinite(out)) else None


@durable("pfedgp.SoftmaxClient")
class SoftmaxClient(PFedGPClient):
    """pFedGP's client with a shared softmax head instead of the personal GP (the FedAvg baseline)."""

    def predict_many(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.layout.arch.n_inputs or not np.all(np.isfinite(X)):
            raise NonFiniteError(f"expected finite inputs of {self.layout.arch.n_inputs} values")
        W, b = _head(self, self.theta)
        z = self.embed(X) @ W.T + b
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def refresh(self, rebuild: bool = False) -> None:
        self._stale = False  # nothing personal to refresh

    def _refresh(self, budget: ClassBudget, rebuild: bool = False) -> float:
        return 0.0  # nothing personal: no work

    def fit(self) -> bool:
        if self.queue or len(self.budget) < 2:
            return False
        X, y, _ = self.budget.arrays()
        new = fit_softmax(self, X, y)
        self.n_fits += 1
        if new is None:
            return False
        for ch in split_vector(self.next_proposal, new - self.theta, self.max_chunk_numbers):
            self.queue.append(chunk_update(ch, float(len(self.budget)), 0, 0, self.epoch))
        self.next_proposal += 1
        self.n_proposals += 1
        return True
