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
    momentum, adam, adamw, adagrad, signum, muon        stateful rules
    InversePower(lr, power)          eta_t = lr (t + 2)^-power: a schedule for adam / adamw

Every rule is a chain of small transforms (:mod:`.transforms`, optax's ``chain``) with
explicit state, e.g. ``adagrad = rule("adagrad", {"lr": lr}, scale_by_rss(),
scale_by_learning_rate(lr))``; a transform that the compiled engine runs carries its
counterpart as data (``Transform.kernel``, :mod:`.kernel_ops`), so any rule made of such
parts runs compiled, whatever its name. Gradients arrive in scaled form (:class:`Scaled`):
normalised rules are exact however far the gradient has underflowed float64. Adding a
rule: one line (``rule(...)``; ``@register`` it to give it a name); a transform: one
function in ``transforms.py`` plus its test (docs/extending.md).
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
    register,
)
from .kernel_ops import KernelOp, Op
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
from .stateful import adagrad, adam, adamw, momentum, muon, newton_schulz, signum
from .torch_adapter import RuleOptimizer, torch_optimizer
from .transforms import (
    Transform,
    add_decayed_weights,
    chain,
    descend,
    mirror_step,
    normalize_by,
    orthogonalize,
    rule,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_param_norm,
    scale_by_polyak,
    scale_by_rss,
    scale_by_sign,
    scale_by_steepest,
    trace,
    trace_scaled,
)

__all__ = [
    "Optimizer", "Scaled", "RULES", "InversePower", "get", "register", "as_scaled", "normalize", "log_norm",
    "log_global_norm", "gd", "sgd", "ngd", "sngd", "nsd", "sign_descent", "spectral_descent",
    "coordinate_descent", "polyak", "mirror", "momentum", "adam", "adamw", "adagrad", "signum",
    "muon", "newton_schulz", "RuleOptimizer", "torch_optimizer",
    "Transform", "KernelOp", "Op", "chain", "rule", "scale_by_learning_rate", "scale_by_steepest",
    "scale_by_sign", "normalize_by", "scale_by_param_norm", "trace", "trace_scaled",
    "scale_by_adam", "scale_by_rss", "orthogonalize", "add_decayed_weights", "scale_by_polyak",
    "descend", "mirror_step",
]
