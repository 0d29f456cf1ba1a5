"""Step rules of docs/theory.md §6 and beyond, optax-shaped and batched over trials.

    opt = attnsvm.optim.get("adam", lr=1e-2, eps=0.0)     # or adam(lr=..), ngd(lr=..), ...
    state = opt.init(params)                              # params: {name: (B, ...)}
    params, state = opt.update(grads, state, params, log_gap)

Every rule is registered by name (``sorted(attnsvm.optim.RULES)``) and is used the same way
by ``attnsvm.train``, the CLI, the experiments and, through :func:`torch_optimizer`, by
``nn.Module`` training. Rules (see each constructor's docstring for the update formula):

    gd, sgd                          W <- W - lr G
    ngd, sngd, nsd(norm)             normalised steepest descent: W <- W - lr D*(G) in a norm
    sign, spectral, coordinate       nsd for the l_inf, spectral and l_1 norms
    polyak                           eta_t = c (L - L*) / ||G||^2
    mirror (md<p>)                   l_p mirror descent, plain or normalised
    momentum, adam, adamw, signum, muon        stateful rules
    InversePower(lr, power)          eta_t = lr (t + 2)^-power: a schedule for adam / adamw

Gradients arrive in scaled form (:class:`Scaled`): normalised rules are exact however far
the gradient has underflowed float64. Adding a rule: one decorated constructor in
``rules.py`` or ``stateful.py`` plus its test.
"""

from .base import (
    RULES,
    InversePower,
    Optimizer,
    Scaled,
    as_scaled,
    get,
    log_global_norm,
    log_norm,
    normalize,
)
from .rules import (
    coordinate_descent,
    gd,
    mirror,
    ngd,
    nsd,
    polyak,
    sgd,
    sign_descent,
    sngd,
    spectral_descent,
)
from .stateful import adam, adamw, momentum, muon, newton_schulz, signum
from .torch_adapter import RuleOptimizer, torch_optimizer

__all__ = [
    "Optimizer", "Scaled", "RULES", "InversePower", "get", "as_scaled", "normalize", "log_norm",
    "log_global_norm", "gd", "sgd", "ngd", "sngd", "nsd", "sign_descent", "spectral_descent",
    "coordinate_descent", "polyak", "mirror", "momentum", "adam", "adamw", "signum", "muon",
    "newton_schulz", "RuleOptimizer", "torch_optimizer",
]
