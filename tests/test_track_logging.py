"""The tracker in the tools people watch (issue 34, item 2): a real Hugging Face Trainer with
``report_to="tensorboard"`` and a real Lightning Trainer with its TensorBoardLogger write the
tracker's per-layer summaries, read back from the event files with tensorboard's own reader
and compared with ``Tracker.summary`` computed independently from the table; ``to_tensorboard``
with a real ``SummaryWriter``; ``plot()``'s axes and legend. Tiny models from configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm.track import TrackConfig, Tracker

transformers = pytest.importorskip("transformers")

FAST = TrackConfig(max_queries=4, null_draws=0, rot_draws=2)


def _events(root: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of every scalar in the event files under ``root`` (tensorboard's
    EventAccumulator)."""
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out: dict[str, list] = {}
    dirs = sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    assert dirs, f"no event file under {root}"
    for d in dirs:
        ea = ea_mod.EventAccumulator(str(d))
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in ea.Scalars(tag))
    return out


def _expected(tab: pd.DataFrame) -> dict[tuple[str, int], float]:
    """The summaries recomputed from the table by hand (not through Tracker.summary)."""
    want = {}
    for (step, layer), g in tab.groupby(["step", "layer"]):
        want[(f"attnsvm/corr_mm/layer{layer}", step)] = float(g.corr_mm.median())
        want[(f"attnsvm/soft_sparsity/layer{layer}", step)] = float(g.soft_sparsity.median())
        want[(f"attnsvm/wqk_norm/layer{layer}", step)] = float(g.wqk_norm.median())
        want[(f"attnsvm/certified/layer{layer}", step)] = float((g.status == "optimal").mean())
    return want


def _gpt2(n_layer=2):
    torch.manual_seed(0)
    tf = transformers
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=40, n_positions=16, n_embd=8, n_layer=n_layer,
                                            n_head=2, bos_token_id=0, eos_token_id=0))


def _ids(n=6, T=7):
    return torch.randint(1, 40, (n, T), generator=torch.Generator().manual_seed(0))


def test_hf_trainer_report_to_tensorboard_carries_the_summaries(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    tf = transformers
    model = _gpt2()
    ids = _ids()
    data = [dict(input_ids=ids[i], labels=ids[i]) for i in range(len(ids))]
    tr = Tracker(model, dict(input_ids=ids[:3]), every=2, config=FAST)
    args = tf.TrainingArguments(output_dir=str(tmp_path / "t"), max_steps=4,
                                per_device_train_batch_size=3, report_to="tensorboard",
                                save_strategy="no", use_cpu=True,
                                logging_steps=100, learning_rate=1e-2)
    trainer = tf.Trainer(model=model, args=args, train_dataset=data, callbacks=[tr.callback()])
    trainer.train()
    tab = tr.table
    assert sorted(tab.step.unique()) == [0, 2, 4]
    want = _expected(tab)
    ev = _events(tmp_path)
    got = {(tag.removeprefix("train/"), s): v for tag, vals in ev.items() for s, v in vals
           if "attnsvm/" in tag}
    assert set(want) == set(got), sorted(set(want) ^ set(got))
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k  # event files hold float32
    # the Trainer's own log history carries them too
    hist = [h for h in trainer.state.log_history if "attnsvm/corr_mm/layer0" in h]
    assert [h["step"] for h in hist] == [0, 2, 4]
    assert hist[-1]["attnsvm/wqk_norm/layer1"] == pytest.approx(want[("attnsvm/wqk_norm/layer1", 4)])


def test_lightning_trainer_logs_the_summaries_to_tensorboard(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger

    model = _gpt2(n_layer=1)
    ids = _ids()

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, i):
            return self.net(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    tr = Tracker(model, dict(input_ids=ids[:3]), steps=[0, 1, 3], config=FAST, out=tmp_path / "pq")
    logger = TensorBoardLogger(save_dir=str(tmp_path / "tb"), name="run", version=0)
    trainer = pl.Trainer(max_steps=3, logger=logger, callbacks=[tr.lightning_callback()],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", log_every_n_steps=100)
    loader = torch.utils.data.DataLoader(ids, batch_size=2)
    trainer.fit(Module(), loader)
    logger.finalize("success")
    tab = tr.table
    assert sorted(tab.step.unique()) == [0, 1, 3]
    assert (tmp_path / "pq" / "track.parquet").is_file()
    ev = _events(tmp_path / "tb")
    want = _expected(tab)
    got = {(tag, s): v for tag, vals in ev.items() for s, v in vals if tag.startswith("attnsvm/")}
    assert set(want) == set(got), sorted(set(want) ^ set(got))
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k


def test_to_tensorboard_with_a_real_summary_writer(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    x = torch.randn(3, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tr = Tracker(mha, lambda m: m(x, x, x), steps=[0, 3], config=FAST)
    for s in range(4):
        tr.step(s)
        with torch.no_grad():
            mha.in_proj_weight.mul_(1.5)  # the heads change between records
    w = SummaryWriter(str(tmp_path / "tb"))
    n = tr.to_tensorboard(w, heads=True)
    w.close()
    ev = _events(tmp_path / "tb")
    assert n == sum(len(v) for v in ev.values()) == 2 * (4 + 2)
    for (tag, step), v in _expected(tr.table).items():
        assert dict(ev[tag])[step] == pytest.approx(v, rel=1e-6, abs=1e-7)
    t = tr.table
    head1 = t[(t.step == 3) & (t["head"] == 1)].corr_mm.item()
    assert dict(ev["attnsvm/corr_mm/layer0/head1"])[3] == pytest.approx(head1, rel=1e-6)
    with pytest.raises(ValueError, match="add_scalar"):
        tr.to_tensorboard(object())


def test_summary_and_plot(tmp_path):
    model = _gpt2()
    tr = Tracker(model, dict(input_ids=_ids()[:3]), steps=[0, 1, 10], config=FAST)
    for s in range(11):
        tr.step(s)
    s = tr.summary(10)
    g = tr.table[(tr.table.step == 10) & (tr.table.layer == 1)]
    assert s["attnsvm/corr_mm/layer1"] == pytest.approx(np.median(g.corr_mm))
    with pytest.raises(ValueError, match="step 5 was not recorded"):
        tr.summary(5)
    fig = tr.plot(path=tmp_path / "track.png")
    assert (tmp_path / "track.png").stat().st_size > 1000
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog" and len(fig.axes) == 3
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "layer (module)"
    assert [t.get_text() for t in legend.get_texts()] == ["layer 0 (transformer.h.0.attn)",
                                                          "layer 1 (transformer.h.1.attn)"]
    # the thick line of layer 0 is the median over heads at each recorded step
    med = tr.table[tr.table.layer == 0].groupby("step").corr_mm.median()
    line = [ln for ln in ax.get_lines() if ln.get_label() == "layer 0 (transformer.h.0.attn)"][0]
    np.testing.assert_allclose(line.get_xdata(), med.index)
    np.testing.assert_allclose(line.get_ydata(), med.to_numpy())
    with pytest.raises(ValueError, match="nothing recorded"):
        Tracker(model, dict(input_ids=_ids()[:3])).plot()
