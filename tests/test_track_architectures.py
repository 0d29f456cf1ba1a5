"""The verified-architectures table (docs/tracking.md): tiny random models of every supported
family, built from configs (no download), run under SDPA, every extraction checked against
the model's own eager attention; wrong extractors and unsupported configs refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnsvm.track import RecomputeError, TrackConfig, Tracker  # noqa: E402
from attnsvm.track.extract import (  # noqa: E402
    SUPPORTED_MODEL_TYPES,
    UnsupportedModelError,
    check_config,
    hf_decoder,
    hf_linear,
)
from attnsvm.track.heads import rotary_basis  # noqa: E402
from attnsvm.track.verify import TINY_CONFIGS, probe_inputs, tiny_config, tiny_model, verify  # noqa: E402

FAST = TrackConfig(max_queries=3, null_draws=0, rot_draws=0)
AVAILABLE = [mt for mt, (cls, _) in TINY_CONFIGS.items() if hasattr(transformers, cls)]
EXPECTED_KINDS = {"bart": "causal/cross/self", "t5": "causal/cross/self",
                  "bert": "self", "roberta": "self", "distilbert": "self", "vit": "self"}
ROTARY = {"llama", "qwen2", "mistral", "gemma", "phi", "gpt_neox"}


def test_at_least_twelve_families_are_verified():
    assert len(AVAILABLE) >= 12 and set(AVAILABLE) <= set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", AVAILABLE)
def test_recompute_under_sdpa_within_1e6(model_type):
    row = verify([model_type], config=FAST).iloc[0]
    assert row.runs_under == "sdpa"  # the user's implementation; the probe pass is eager
    assert row.recompute_err <= 1e-6, row.to_dict()
    assert row.kinds == EXPECTED_KINDS.get(model_type, "causal")
    # rotary heads are lifted (L = number of rotary basis matrices); others are not
    assert (row.rotary_L > 1) == (model_type in ROTARY)


def test_grouped_query_heads_share_their_key_map():
    model = tiny_model("llama", num_attention_heads=4, num_key_value_heads=1)
    (_, call), _ = Tracker(model, probe_inputs(model), config=FAST).capture()
    kp = model.layers[0].self_attn.k_proj.weight.detach()  # (1 * d_h, d)
    for h in range(4):
        torch.testing.assert_close(call.W_k[h], kp, rtol=0, atol=0)
    qp = model.layers[0].self_attn.q_proj.weight.detach().reshape(4, 8, -1)
    torch.testing.assert_close(call.W_q, qp, rtol=0, atol=0)
    assert call.scale_ == pytest.approx(8 ** -0.5)


def test_rotary_lift_reproduces_every_relative_rotation():
    """sum_l g_l(k, t) B_l == R_k^T R_t for every pair (independent of the SVD that found B),
    and for full RoPE the lift has L = d_h matrices; B is orthonormal."""
    model = tiny_model("llama")
    (_, call), _ = Tracker(model, probe_inputs(model), config=FAST).capture()
    R = call.rotary.numpy()
    B, g = rotary_basis(R)
    assert B.shape[0] == 8
    np.testing.assert_allclose(np.einsum("lab,mab->lm", B, B), np.eye(8), atol=1e-12)
    G = np.einsum("nkca,ntcb->nktab", R, R)
    np.testing.assert_allclose(np.einsum("nktl,lab->nktab", g, B), G, atol=1e-12)
    # a RoPE rotation depends on the offset only: G(k, t) = G(0, t - k)
    np.testing.assert_allclose(G[0, 3, 7], G[0, 0, 4], atol=1e-12)


def _scaled(ext, factor=20.0):
    def wrong(module, args, kwargs):
        call = ext(module, args, kwargs)
        call.W_q = call.W_q * factor  # the audit's wrong extractor: q weights scaled by 20
        return call
    return wrong


@pytest.mark.parametrize("model_type", ["bert", "llama"])
def test_a_wrong_extractor_is_refused(model_type):
    model = tiny_model(model_type)
    name = "encoder.layer.0.attention.self" if model_type == "bert" else "layers.0.self_attn"
    ext = hf_linear("query", "key") if model_type == "bert" else hf_decoder
    tr = Tracker(model, probe_inputs(model), config=FAST, modules=[name],
                 extractors={name: _scaled(ext)})
    with pytest.raises(RecomputeError, match="do not reproduce"):
        tr.record(0)
    # the same extractor unscaled passes; check=False opts out knowingly: the model then runs
    # under its own SDPA, returns no probabilities, and the error is reported as not computed
    ok = Tracker(model, probe_inputs(model), config=FAST, modules=[name],
                 extractors={name: ext}).record(0)
    assert (ok.recompute_err <= 1e-6).all()
    tab = Tracker(model, probe_inputs(model), config=TrackConfig(svm=False, check=False),
                  modules=[name], extractors={name: _scaled(ext)}).record(0)
    assert tab.recompute_err.isna().all() and model.config._attn_implementation == "sdpa"


def test_unsupported_configs_are_refused_with_the_families():
    for cfg in (dict(model_type="falcon"), dict(model_type="qwen3")):
        with pytest.raises(UnsupportedModelError, match="supported families: GPT-2 .*Llama"):
            check_config(cfg)
    with pytest.raises(UnsupportedModelError, match="qk_layernorm"):
        check_config(tiny_config("phi", qk_layernorm=True))
    with pytest.raises(UnsupportedModelError, match="relative_key"):
        check_config(dict(model_type="bert", position_embedding_type="relative_key"))
    assert check_config(tiny_config("t5")) == "T5"


def test_unsupported_model_refused_before_its_weights_are_read(tmp_path):
    """A folder whose config names an unsupported family and whose weights file is garbage:
    the probe refuses it from config.json (a weights read would fail differently)."""
    from attnsvm.realdata.probe import load_model

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon"}))
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UnsupportedModelError, match="'falcon' is not supported"):
        load_model(tmp_path)


def _train_llama(steps, tracker_steps=None):
    """A tiny Llama (GQA, RoPE, SDPA) trained by NTP with AdamW on sequences whose second half
    repeats the first (a copy task); optionally tracked. Returns (model, losses, tracker)."""
    model = transformers.LlamaForCausalLM(tiny_config("llama")).double()
    torch.manual_seed(0)
    for p in model.parameters():  # seeded init independent of the config's init order
        torch.nn.init.normal_(p, std=0.1)
    g = torch.Generator().manual_seed(1)
    half = torch.randint(3, 64, (64, 6), generator=g)
    data = torch.cat([half, half], 1)
    tr = None
    if tracker_steps is not None:
        tr = Tracker(model.model, dict(input_ids=data[:4]), steps=tracker_steps, config=FAST,
                     tags={"optimizer": "adamw"})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        if tr is not None:
            tr.step(step)
        ids = data[(step * 8) % 64:(step * 8) % 64 + 8]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return model, losses, tr


def test_tracker_follows_a_llama_decoder_through_training():
    model, losses, tr = _train_llama(41, tracker_steps=[0, 20, 40])
    tab = tr.table
    assert sorted(tab.step.unique()) == [0, 20, 40] and len(tab) == 3 * 2 * 4
    assert (tab.recompute_err <= 1e-6).all() and (tab.lift_dim == 8).all()
    assert tab.feasible.all() and (tab.optimizer == "adamw").all()
    assert (tab.kind == "causal").all() and model.config._attn_implementation == "sdpa"
    assert losses[-1] < 0.8 * losses[0]
    # the heads change as training goes (their key-query norms move)
    n = tab.groupby("step").wqk_norm.mean()
    assert abs(n[40] - n[0]) > 1e-3 * n[0]
    # tracking never perturbs training: the untracked run ends in the same weights, bit for bit
    plain, _, _ = _train_llama(41)
    for (k, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), k


def test_default_schedule_keeps_to_its_time_budget(monkeypatch):
    """The default schedule records at the first call, then only while the recording time is
    at most `budget` of the elapsed time (a fake clock: each record costs 1 s, a step 0.1 s)."""
    import attnsvm.track.tracker as trk

    model = tiny_model("gpt2")
    clock = [0.0]
    monkeypatch.setattr(trk.time, "perf_counter", lambda: clock[0])
    tr = Tracker(model, probe_inputs(model), config=TrackConfig(svm=False), budget=0.1)
    real_capture = tr.capture

    def capture(*a, **k):
        clock[0] += 1.0  # the record's cost, seen by the tracker's own timing
        return real_capture(*a, **k)

    monkeypatch.setattr(tr, "capture", capture)
    got = []
    for step in range(400):
        if tr.step(step) is not None:
            got.append(step)
        clock[0] += 0.1
    assert got[0] == 0 and len(got) >= 3
    # at every record the time already spent was within the budget of the elapsed time
    total = 400 * 0.1 + len(got)
    assert len(got) <= 0.1 * total + 1
    with pytest.raises(ValueError, match="budget"):
        Tracker(model, probe_inputs(model), budget=0)


def test_rope_lift_of_a_trained_factored_head():
    """docs/theory.md: a RoPE head's logit is linear in the lifted Theta (its own rotations
    reproduce it, else rope_head_study raises); the three SVMs are solved and compared."""
    pytest.importorskip("cvxpy")
    from attnsvm.track.rope import plane_basis, rope_head_study, rope_rotations

    B = plane_basis(4)
    np.testing.assert_allclose(np.einsum("lab,mab->lm", B, B), np.eye(4), atol=1e-15)
    R, theta = rope_rotations(6, 4)
    for k, t in ((1, 4), (5, 2)):  # R_k^T R_t = R_{t-k} = sum_l g_l B_l with sqrt2 (cos, sin)
        G = R[k].T @ R[t]
        want = sum(np.sqrt(2) * (np.cos((t - k) * th) * B[2 * b] + np.sin((t - k) * th) * B[2 * b + 1])
                   for b, th in enumerate(theta))
        np.testing.assert_allclose(G, want, atol=1e-12)
    res = rope_head_study(seed=0, steps=60)
    for c in ("corr_fro", "corr_group_nuclear", "corr_no_lift"):
        assert -1 <= res[c] <= 1


def test_probe_refuses_an_image_model_from_its_config(tmp_path):
    from attnsvm.realdata.probe import load_model

    tiny_config("vit").save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(UnsupportedModelError, match="ViT.*feeds text"):
        load_model(tmp_path)
