"""skfedgp: federated and distributed Gaussian processes for scikit-learn.

Estimators
----------
FederatedHierarchicalGPRegressor
    pFedHGP: shared global sparse GP + per-client deviation + local sparse GP,
    trained federatedly (``papers/pfedhgp.txt``; SPEC section 1).
MaxEvidenceClassifier
    Whole-curve classification by the largest predictive evidence, one
    client per class (SPEC section 2).
OperatorClustering
    Clusters clients by their trace-normalised kernel operators (SPEC
    section 2).
"""

from ._linalg import CholeskyError
from .regressor import FederatedHierarchicalGPRegressor
from .classifier import MaxEvidenceClassifier
from .clustering import OperatorClustering

__version__ = "0.1.0"

__all__ = [
    "FederatedHierarchicalGPRegressor",
    "MaxEvidenceClassifier",
    "OperatorClustering",
    "CholeskyError",
    "__version__",
]
