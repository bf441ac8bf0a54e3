"""CRR (Critic Regularized Regression, Wang et al. 2020): a policy that clones the dataset's
actions weighted by their advantage under a learned critic; offline only
(``rlherd train crr --env ENV --dataset ID``)."""

from rlherd.agents.crr.builder import CRRBuilder
from rlherd.agents.crr.config import CRRConfig

__all__ = ["CRRBuilder", "CRRConfig"]
