"""skfedgp: federated and distributed Gaussian processes for scikit-learn.

Estimators
----------
FederatedHierarchicalGPRegressor
    pFedHGP: shared global sparse GP + per-client deviation + local sparse GP,
    trained federatedly (H. Yan, "Personalized Federated Hierarchical Gaussian
    Processes for Privacy-Preserving Modeling of Heterogeneous Distributed
    Systems", arXiv:2609.19337, 2026; ``docs/maths.md``).
"""

from ._linalg import CholeskyError
from .regressor import ClientLabelWarning, FederatedHierarchicalGPRegressor

__version__ = "0.1.0"

__all__ = ["FederatedHierarchicalGPRegressor", "CholeskyError", "ClientLabelWarning",
           "__version__"]
