"""skfedgp: federated and distributed Gaussian processes for scikit-learn.

Estimators
----------
FederatedHierarchicalGPRegressor
    pFedHGP: shared global sparse GP + per-client deviation + local sparse GP,
    trained federatedly (H. Yan, "Personalized Federated Hierarchical Gaussian
    Processes for Privacy-Preserving Modeling of Heterogeneous Distributed
    Systems", arXiv:2609.19337, 2026; ``docs/maths.md``).
MaxEvidenceClassifier
    Whole-curve classification by the largest predictive evidence, one client
    per class (same paper, section 3.8.1).
OperatorClustering
    Clusters clients by spectral clustering of dissimilarities between
    per-client operators in inducing-feature space; by default operators of
    each client's fitted personal function, optionally the paper's kernel
    operators (same paper, section 3.8.2).
PFedGPRegressor
    The pFedHGP paper's comparison baseline (Achituve et al., NeurIPS 2021, as
    adapted in section 4.4): per-client multi-output GPs whose kernel
    lengthscales are averaged FedAvg-style each round.
AsyncDGPRegressor
    Asynchronous distributed GP experts aggregated through an information set
    of past predictions (Async DGP), with MoE/PoE/gPoE/BCM/rBCM baselines.
"""

from ._linalg import CholeskyError
from .async_dgp import AsyncDGPRegressor
from .baselines import PFedGPRegressor
from .classifier import MaxEvidenceClassifier
from .clustering import OperatorClustering
from .regressor import (
    ClientFittedAsNoiseWarning,
    ClientLabelWarning,
    CollinearOutputsWarning,
    FederatedHierarchicalGPRegressor,
    InputScaleWarning,
    SharedPartsOffWarning,
    SparseApproximationWarning,
    UnderObservedOutputWarning,
)

__version__ = "0.1.0"

__all__ = [
    "FederatedHierarchicalGPRegressor",
    "MaxEvidenceClassifier",
    "OperatorClustering",
    "AsyncDGPRegressor",
    "PFedGPRegressor",
    "CholeskyError",
    "ClientFittedAsNoiseWarning",
    "ClientLabelWarning",
    "CollinearOutputsWarning",
    "InputScaleWarning",
    "SharedPartsOffWarning",
    "SparseApproximationWarning",
    "UnderObservedOutputWarning",
    "__version__",
]
