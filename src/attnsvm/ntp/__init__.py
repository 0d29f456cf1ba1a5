"""Next-token prediction (NTP) with one causal self-attention layer (docs/theory.md
"Next-token prediction"; Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024).

    data = ntp_random(10, 6, 8, 8, graph="cyclic", seed=0)     # or NTPData(E, seqs, y)
    sol = attnsvm.svm.graph_svm(data.E, data.seqs, data.y)      # the certified Graph-SVM
    traj = attnsvm.train.train(NTPModel(8), data, optimizer="ngd", steps=1000)
    fin = w_fin(data)                                           # the soft-composition part

Modules: :mod:`.data` (datasets, generators), :mod:`.text` (token ids from text), :mod:`.graph` (priority graphs,
SCCs, Graph-SVM rows), :mod:`.fin` (W_fin and the decomposition W_t ~ R W_svm + W_fin),
:mod:`.model` (the NTP model and its stable loss; it trains through :func:`attnsvm.train.train`).
"""

from .data import GRAPH_KINDS, PUBLISHED_SIZES, NTPData, load_ntp, ntp_random
from .fin import FinResult, decompose, s_fin_basis, w_fin
from .graph import GraphRows, graph_rows, priority_graph, scc_table
from .model import HEADS, NTPModel, ntp_tensors
from .text import from_text

__all__ = [
    "NTPData", "ntp_random", "from_text", "load_ntp", "PUBLISHED_SIZES", "GRAPH_KINDS",
    "priority_graph", "scc_table", "graph_rows", "GraphRows",
    "w_fin", "s_fin_basis", "decompose", "FinResult", "NTPModel", "ntp_tensors",
    "HEADS",
]


def __getattr__(name):
    """``train_ntp`` left this package (it imports nothing above it): the deprecated alias
    lives with the trainer, :func:`attnsvm.train.train_ntp`; the one trainer is
    :func:`attnsvm.train.train`."""
    if name == "train_ntp":
        raise AttributeError("attnsvm.ntp.train_ntp moved: use attnsvm.train.train(NTPModel(...), "
                             "data, optimizer=...) (the deprecated alias is attnsvm.train.train_ntp)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
