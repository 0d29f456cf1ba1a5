"""attnsvm: max-margin token selection in attention, as software.

Training a softmax-attention layer by gradient descent converges in direction to
the solution of a hard-margin SVM that separates the tokens attention selects
from the rest (see docs/theory.md). This package trains many such models at once,
solves the matching max-margin problems with checkable certificates, and
reproduces the papers' experiments.
"""

__version__ = "0.1.0"
