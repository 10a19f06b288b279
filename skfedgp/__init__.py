"""skfedgp: federated and distributed Gaussian processes for scikit-learn.

Estimators
----------
FederatedHierarchicalGPRegressor
    pFedHGP: shared global sparse GP + per-client deviation + local sparse GP,
    trained federatedly (``papers/pfedhgp.txt``; SPEC section 1).
"""

from ._linalg import CholeskyError
from .regressor import FederatedHierarchicalGPRegressor
from .async_dgp import AsyncDGPRegressor

__version__ = "0.1.0"

__all__ = ["FederatedHierarchicalGPRegressor", "CholeskyError", "__version__"]
