"""Adam on flat parameter vectors (Kingma & Ba, 2015).

Used by the clients for their local steps and by the server for the global
step of pFedHGP (docs/maths.md, "Federated training"; pFedHGP paper,
Algorithm 1).
"""

from __future__ import annotations

import numpy as np

__all__ = ["Adam"]


class Adam:
    """Adam optimiser for *maximising* an objective over a flat vector.

    Parameters
    ----------
    learning_rate : float or ndarray of shape (p,), default=0.1
        Step size (units of the unconstrained parameters); an array gives
        each coordinate its own step size.
    beta1 : float, default=0.9
        Decay of the first-moment estimate.
    beta2 : float, default=0.999
        Decay of the second-moment estimate.
    eps : float, default=1e-8
        Added to the root of the second moment.

    Attributes
    ----------
    t : int
        Number of steps taken.
    m, v : ndarray of shape (p,) or None
        First and second moment estimates (None before the first step).

    Raises
    ------
    ValueError
        If a hyperparameter is out of range, or a gradient is not finite
        (raised by :meth:`step`, which then leaves the state unchanged).
    """

    def __init__(self, learning_rate=0.1, beta1=0.9, beta2=0.999, eps=1e-8):
        self.set_learning_rate(learning_rate)
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError("beta1 and beta2 must lie in [0, 1)")
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.eps = float(eps)
        self.t = 0
        self.m = None
        self.v = None

    def set_learning_rate(self, learning_rate):
        """Set the step size; the moments and the step count continue (Kingma
        and Ba, "Adam: a method for stochastic optimization", ICLR 2015,
        Algorithm 1: the step size is a free parameter of each update).

        Parameters
        ----------
        learning_rate : float or ndarray of shape (p,)
            As in the constructor.

        Raises
        ------
        ValueError
            If a step size is not positive and finite.
        """
        lr = np.asarray(learning_rate, dtype=float)
        if lr.size == 0 or not np.all(np.isfinite(lr)) or not np.all(lr > 0):
            raise ValueError(f"learning_rate must be positive, got {learning_rate}")
        self.learning_rate = float(lr) if lr.ndim == 0 else lr

    def step(self, theta, grad):
        """Return ``theta`` moved one Adam step *up* the gradient.

        Parameters
        ----------
        theta : ndarray of shape (p,)
            Current parameters (not modified).
        grad : ndarray of shape (p,)
            Gradient of the objective to maximise at ``theta``.

        Returns
        -------
        theta_new : ndarray of shape (p,)
        """
        grad = np.asarray(grad, dtype=float)
        if grad.shape != np.shape(theta):
            raise ValueError(f"gradient shape {grad.shape} != parameter shape {np.shape(theta)}")
        if not np.all(np.isfinite(grad)):
            raise ValueError("non-finite gradient passed to Adam.step")
        if self.m is None:
            self.m = np.zeros_like(grad)
            self.v = np.zeros_like(grad)
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        mhat = self.m / (1 - self.beta1**self.t)
        vhat = self.v / (1 - self.beta2**self.t)
        return theta + self.learning_rate * mhat / (np.sqrt(vhat) + self.eps)
