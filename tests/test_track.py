"""attnsvm.track on tiny random models of every supported architecture (built from configs,
no download): the recomputed attention equals the model's own probabilities, the extracted
W = scale W_k^T W_q reproduces the model's logits (and a transposed mapping does not), the SVM
step equals the core seq-to-seq solver, and the tracker's API (schedule, Parquet, context
manager, Hugging Face callback, errors naming the module)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from attnsvm.track import (
    AttentionCall,
    TrackConfig,
    Tracker,
    allowed_from_mask,
    analyse_call,
    head_subspace,
    log_steps,
    recompute_attention,
    register_extractor,
    rotation_null,
    split_heads,
    track,
)

transformers = pytest.importorskip("transformers")

N, T = 3, 7


def _ids(vocab=40, offset=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(offset, vocab, (N, T), generator=g)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[1, 5:] = 0  # padding
    return ids, mask


def _sharpen(model, scale=5.0):
    """Scale the query/key weights so that attention is far from uniform (random init is
    nearly uniform), and give the biases non-trivial values."""
    names = ("query", "key", "q_lin", "k_lin", "c_attn", "q_proj", "k_proj")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if any(f".{k}." in f".{n}" or n.endswith(f"{k}.weight") or n.endswith(f"{k}.bias")
                   for k in names):
                if p.dim() > 1:
                    p.mul_(scale)
                else:
                    p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


def hf_models():
    """name -> (model, inputs); tiny configs, eager attention, float64."""
    tf = transformers
    ids, mask = _ids()
    common = dict(num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                  attn_implementation="eager")
    torch.manual_seed(0)
    out = {
        "bert": (tf.BertModel(tf.BertConfig(vocab_size=40, hidden_size=8, **common)),
                 dict(input_ids=ids, attention_mask=mask)),
        "roberta": (tf.RobertaModel(tf.RobertaConfig(vocab_size=44, hidden_size=8, **common)),
                    dict(input_ids=ids + 2, attention_mask=mask)),
        "distilbert": (tf.DistilBertModel(tf.DistilBertConfig(
            vocab_size=40, dim=8, n_layers=2, n_heads=2, hidden_dim=16, attn_implementation="eager")),
            dict(input_ids=ids, attention_mask=mask)),
        "gpt2": (tf.GPT2Model(tf.GPT2Config(vocab_size=40, n_positions=16, n_embd=8, n_layer=2,
                                            n_head=2, attn_implementation="eager",
                                            bos_token_id=0, eos_token_id=0)),
                 dict(input_ids=ids, attention_mask=mask)),
        "vit": (tf.ViTModel(tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8,
                                         **common)),
                dict(pixel_values=torch.randn(N, 1, 8, 8, generator=torch.Generator().manual_seed(0),
                                              dtype=torch.float64))),
    }
    return {k: (_sharpen(m.double().eval()), inp) for k, (m, inp) in out.items()}


MODELS = hf_models()
# ViT computes its softmax in float32 by design (eager_attention_forward upcasts to float32)
TOL = {"vit": 1e-6}


@pytest.mark.parametrize("name", list(MODELS))
def test_recomputed_attention_equals_the_model(name):
    model, inp = MODELS[name]
    with torch.no_grad():
        out = model(**inp, output_attentions=True)
    calls = Tracker(model, inp).capture()
    assert len(calls) == 2
    for layer, (_, call) in enumerate(calls):
        s, allowed, qv = recompute_attention(call)
        ref = out.attentions[layer].double()
        assert call.causal == (name == "gpt2")
        both = qv[:, None, :, None] & allowed[:, None]
        err = (torch.where(both, s - ref, 0.0)).abs().max().item()
        assert err < TOL.get(name, 1e-12), (name, layer, err)
        if name != "vit":  # padded queries are invalid, padded keys masked
            assert not qv[1, 5:].any() and qv[1, :5].all()


def _logit_check(call, sub, h, attn, transpose=False):
    """Max over (seq, valid query, allowed key pairs) of |(a_kt - a_kt0) - (log s_kt - log s_kt0)|
    with a_kt = x_t^T W x_k + u^T x_t from the extracted head matrix (model's own s)."""
    x = call.hidden.double().numpy()
    W = sub["W"].T if transpose else sub["W"]
    a = np.einsum("ntd,de,nke->nkt", x, W, x) + (x @ sub["u"])[:, None, :]
    s, allowed, qv = (t.numpy() for t in recompute_attention(call))
    logs = np.log(np.where(allowed, attn[:, h], 1.0))
    worst = 0.0
    for n in range(x.shape[0]):
        for k in np.nonzero(qv[n])[0]:
            t = np.nonzero(allowed[n, k])[0]
            da, dl = a[n, k, t] - a[n, k, t[0]], logs[n, k, t] - logs[n, k, t[0]]
            worst = max(worst, float(np.abs(da - dl).max()) / max(1.0, float(np.abs(dl).max())))
    return worst


@pytest.mark.parametrize("name", ["bert", "distilbert", "gpt2", "vit"])
def test_head_matrix_convention_reproduces_logits_and_catches_transposition(name):
    """W = scale W_k^T W_q (keys left) and u = scale W_k^T b_q give the model's logit
    differences; the transposed matrix (the mistake of issue 13) does not."""
    model, inp = MODELS[name]
    with torch.no_grad():
        out = model(**inp, output_attentions=True)
    (_, call), _ = Tracker(model, inp).capture()
    attn = out.attentions[0].double().numpy()
    for h in range(call.n_heads):
        sub = head_subspace(call.W_q[h].numpy(), call.W_k[h].numpy(),
                            None if call.b_q is None else call.b_q[h].numpy(), call.scale_)
        assert _logit_check(call, sub, h, attn) < (1e-5 if name == "vit" else 1e-9)
        assert _logit_check(call, sub, h, attn, transpose=True) > 1e-2
        r = sub["U_K"].shape[1]
        np.testing.assert_allclose(sub["U_K"] @ sub["M"][:, :r] @ sub["U_Q"].T, sub["W"], atol=1e-12)


def test_gpt2_conv1d_mapping_explicitly():
    """GPT-2's Conv1D stores weight (d, 3d) with out = x @ weight: head h's query map is
    weight[:, :d]^T rows h d_h .. (h+1) d_h, checked against c_attn's own output."""
    model, inp = MODELS["gpt2"]
    (_, call), _ = Tracker(model, inp).capture()
    attn0 = model.h[0].attn
    x = call.hidden
    qkv = attn0.c_attn(x)
    d = x.shape[-1]
    q = torch.einsum("ntd,hrd->nthr", x, call.W_q) + call.b_q
    k = torch.einsum("ntd,hrd->nthr", x, call.W_k) + call.b_k
    torch.testing.assert_close(q.reshape(N, T, d), qkv[..., :d], rtol=0, atol=1e-12)
    torch.testing.assert_close(k.reshape(N, T, d), qkv[..., d:2 * d], rtol=0, atol=1e-12)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_multihead_attention(batch_first, causal):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(12, 3, batch_first=batch_first).double()
    with torch.no_grad():
        mha.in_proj_weight.mul_(4)
        mha.in_proj_bias.normal_(0, 0.5)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    xin = x if batch_first else x.transpose(0, 1)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    am = torch.ones(7, 7, dtype=torch.bool).triu(1) if causal else None

    def fwd(m):
        return m(xin, xin, xin, key_padding_mask=kpm, attn_mask=am, need_weights=True,
                 average_attn_weights=False)

    with torch.no_grad():
        _, ref = mha(xin, xin, xin, key_padding_mask=kpm, attn_mask=am, need_weights=True,
                     average_attn_weights=False)
    tr = Tracker(mha, fwd, config=TrackConfig(null_draws=1, rot_draws=4))
    (_, call), = tr.capture()
    s, allowed, qv = recompute_attention(call)
    both = qv[:, None, :, None] & allowed[:, None]
    assert (torch.where(both, s - ref, 0.0)).abs().max().item() < 1e-12
    assert bool(allowed[0, 0, 1]) != causal  # the causal attn_mask is read
    tab = tr.record(0)
    assert (tab.recompute_err < 1e-12).all() and tab.feasible.all()


def test_transformer_encoder_fast_path_is_tracked():
    """nn.TransformerEncoderLayer's inference fast path bypasses its attention module; the
    tracker re-runs with gradients enabled so the hooks fire."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(12, 3, 24, batch_first=True, dropout=0.0),
                                2, enable_nested_tensor=False).double().eval()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    tab = Tracker(enc, x, config=TrackConfig(null_draws=0, rot_draws=4)).record(0)
    assert list(tab.module.unique()) == ["layers.0.self_attn", "layers.1.self_attn"]
    assert tab.feasible.all()


def test_svm_step_equals_the_core_seq2seq_solver():
    """One-head causal GPT-2 (d_h = d, so the head subspace is the whole space) with the bias
    ignored: the tracker's W_mm, mapped back to d x d, equals attnsvm.svm.seq2seq_svm on the
    hidden states with the head's own selection (all valid queries)."""
    from attnsvm.svm import seq2seq_svm

    tf = transformers
    torch.manual_seed(3)
    model = tf.GPT2Model(tf.GPT2Config(vocab_size=40, n_positions=16, n_embd=6, n_layer=1, n_head=1,
                                       attn_implementation="eager", bos_token_id=0, eos_token_id=0))
    model = _sharpen(model.double().eval(), 3.0)
    ids, mask = _ids()
    ids, mask = ids[:2, :5], mask[:2, :5]
    tr = Tracker(model, dict(input_ids=ids, attention_mask=mask), matrices=True,
                 config=TrackConfig(bias="ignore", max_queries=100, null_draws=0, rot_draws=0))
    tab = tr.record(0)
    (_, call), = tr.capture()
    assert tab.feasible.all() and tab.n_svm.iloc[0] == int(mask.sum())
    s, allowed, qv = recompute_attention(call)
    alpha = torch.where(allowed[:, None], s, -1.0)[:, 0].argmax(-1).numpy()
    ref = seq2seq_svm(call.hidden.numpy(), alpha, causal=True, mask=mask.bool().numpy())
    W_mm = tr.matrices[(0, 0, 0)]["W_mm"]
    np.testing.assert_allclose(W_mm, ref.W_, atol=1e-7 * np.abs(ref.W_).max())
    assert abs(tab.svm_norm.iloc[0] - ref.norm_) < 1e-7 * ref.norm_


def test_rotation_null_keeps_the_spectrum():
    rng = np.random.default_rng(0)
    M = rng.standard_normal((4, 5))
    W_mm = rng.standard_normal((4, 5))
    from attnsvm.track.heads import _haar

    RK, RQ = _haar(np.random.default_rng(1), 3, 4), _haar(np.random.default_rng(2), 3, 4)
    np.testing.assert_allclose(RK @ RK.transpose(0, 2, 1), np.broadcast_to(np.eye(4), (3, 4, 4)), atol=1e-12)
    c = rotation_null(M, W_mm, 3, np.random.default_rng(1), "augment")
    # same draws by hand: rotated matrix [R_K M0 R_Q^T, R_K b]
    rng1 = np.random.default_rng(1)
    RK, RQ = _haar(rng1, 3, 4), _haar(rng1, 3, 4)
    rot = np.concatenate([RK @ M[:, :4] @ RQ.transpose(0, 2, 1), RK @ M[:, 4:]], 2)
    for j in range(3):
        np.testing.assert_allclose(np.linalg.svd(rot[j, :, :4], compute_uv=False),
                                   np.linalg.svd(M[:, :4], compute_uv=False), rtol=1e-12)
        np.testing.assert_allclose(np.linalg.norm(rot[j, :, 4]), np.linalg.norm(M[:, 4]), rtol=1e-12)
        want = (rot[j] * W_mm).sum() / np.linalg.norm(rot[j]) / np.linalg.norm(W_mm)
        assert abs(c[j] - want) < 1e-12
    big = rotation_null(M, W_mm, 4000, np.random.default_rng(3), "augment")
    assert abs(big.mean()) < 4 * big.std() / np.sqrt(4000)  # mean 0 by symmetry


def test_tracker_schedule_table_parquet_and_context_manager(tmp_path):
    model, inp = MODELS["gpt2"]
    cfg = TrackConfig(max_queries=6, null_draws=1, rot_draws=4)
    with track(model, inp, every=2, config=cfg, out=tmp_path / "run", tags={"optimizer": "sgd"}) as tr:
        got = [tr.step() is not None for _ in range(5)]
    assert got == [True, False, True, False, True]
    tab = pd.read_parquet(tmp_path / "run" / "track.parquet")
    assert sorted(tab.step.unique()) == [0, 2, 4] and (tab.optimizer == "sgd").all()
    assert len(tab) == 3 * 2 * 2  # steps x layers x heads
    for col in ("soft_sparsity", "wqk_norm", "corr_mm", "margin_ratio", "svm_gap", "svm_violation",
                "corr_null_mean", "corr_rot_q95", "recompute_err", "module", "causal"):
        assert col in tab
    sel = pd.read_parquet(tmp_path / "run" / "selections.parquet")
    assert len(sel) == 3 * 2 * 2 * int(inp["attention_mask"].sum())
    assert (sel.key <= sel["query"]).all()  # causal
    assert sel.in_svm.groupby([sel.step, sel.layer, sel["head"]]).sum().eq(6).all()
    tr2 = Tracker(model, inp, steps=[1, 3], config=cfg)
    assert [tr2.due(s) for s in range(5)] == [False, True, False, True, False]
    assert log_steps(100, 5)[0] == 0 and log_steps(100, 5)[-1] == 100


def test_hf_trainer_callback(tmp_path):
    pytest.importorskip("accelerate")
    tf = transformers
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=40, n_positions=16, n_embd=8, n_layer=1,
                                             n_head=2, attn_implementation="eager",
                                             bos_token_id=0, eos_token_id=0))
    ids, _ = _ids()
    data = [dict(input_ids=ids[i], labels=ids[i]) for i in range(N)]
    tr = Tracker(model, dict(input_ids=ids), every=2, out=tmp_path / "cb",
                 config=TrackConfig(max_queries=4, null_draws=0, rot_draws=2))
    args = tf.TrainingArguments(output_dir=str(tmp_path / "t"), max_steps=4, per_device_train_batch_size=3,
                                report_to=[], save_strategy="no", use_cpu=True, logging_strategy="no")
    tf.Trainer(model=model, args=args, train_dataset=data, callbacks=[tr.callback()]).train()
    assert sorted(pd.read_parquet(tmp_path / "cb" / "track.parquet").step.unique()) == [0, 2, 4]


class MyAttention(nn.Module):
    """A hand-written causal attention (no extractor built in)."""

    def __init__(self, d=6, H=2):
        super().__init__()
        self.H, self.qk = H, nn.Linear(d, 2 * d)

    def forward(self, x):
        N, T, d = x.shape
        q, k = self.qk(x).split(d, -1)
        q = q.view(N, T, self.H, -1).transpose(1, 2)
        k = k.view(N, T, self.H, -1).transpose(1, 2)
        logits = q @ k.transpose(-1, -2) / (d // self.H) ** 0.5
        logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(logits, -1)


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = MyAttention()

    def forward(self, x):
        return self.block(x)


def my_extractor(module, args, kwargs):
    x = args[0]
    d = x.shape[-1]
    W, b = module.qk.weight, module.qk.bias
    return AttentionCall(hidden=x, W_q=split_heads(W[:d], module.H), W_k=split_heads(W[d:], module.H),
                         b_q=b[:d].reshape(module.H, -1), b_k=b[d:].reshape(module.H, -1), causal=True)


def test_unsupported_module_error_names_it_and_user_extractor_works():
    torch.manual_seed(0)
    model = MyModel().double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"block \(MyAttention\)"):
        Tracker(model, x)
    with pytest.raises(ValueError, match="no module named 'nope'"):
        Tracker(model, x, extractors={"nope": my_extractor})
    tr = Tracker(model, x, extractors={"block": my_extractor}, config=TrackConfig(null_draws=0, rot_draws=2))
    (_, call), = tr.capture()
    s, _, _ = recompute_attention(call)
    with torch.no_grad():
        torch.testing.assert_close(s, model(x), rtol=0, atol=1e-12)
    assert tr.record(0).feasible.all()
    register_extractor(MyAttention, my_extractor)
    try:
        assert Tracker(model, x).attention[0][0] == "block"
    finally:
        from attnsvm.track import extract

        extract._USER.pop(MyAttention)


def test_bad_extractor_output_and_cross_attention_are_clear_errors():
    model = MyModel().double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)

    def bad(module, args, kwargs):
        return AttentionCall(hidden=args[0], W_q=module.qk.weight, W_k=module.qk.weight)

    with pytest.raises(ValueError, match="W_q must have shape"):
        Tracker(model, x, extractors={"block": bad}).record(0)
    mha = nn.MultiheadAttention(6, 2, batch_first=True).double()
    y = torch.randn(2, 3, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="cross-attention"):
        Tracker(mha, lambda m: m(x, y, y)).record(0)


def test_masks_are_normalised():
    n, t = 2, 3
    hf_add = torch.zeros(n, 1, t, t)
    hf_add[1, :, :, 2] = torch.finfo(torch.float32).min
    a = allowed_from_mask(hf_add, n, t)
    assert a.shape == (n, t, t) and not a[1, :, 2].any() and a[0].all()
    torch.testing.assert_close(allowed_from_mask(hf_add > -1, n, t), a)
    pt_bool = torch.ones(t, t, dtype=torch.bool).triu(1)  # PyTorch: True = masked
    assert torch.equal(allowed_from_mask(pt_bool, n, t, true_means_masked=True)[0],
                       torch.ones(t, t, dtype=torch.bool).tril())
    assert torch.equal(allowed_from_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]), n, t)[0, :, 2],
                       torch.zeros(t, dtype=torch.bool))
    with pytest.raises(ValueError, match="ALiBi"):
        allowed_from_mask(torch.full((t, t), -0.5), n, t)


def test_analyse_call_float32_model_runs_in_float64():
    """A float32 model: statistics are float64, recompute error at float32 rounding."""
    tf = transformers
    torch.manual_seed(0)
    model = _sharpen(tf.BertModel(tf.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=16,
                                                attn_implementation="eager")).eval())
    ids, mask = _ids()
    (_, call), = Tracker(model, dict(input_ids=ids, attention_mask=mask, output_attentions=True)).capture()
    rows, sel, _ = analyse_call(call, TrackConfig(null_draws=0, rot_draws=2))
    assert all(1e-9 < r["recompute_err"] < 1e-5 for r in rows)
    assert sel.prob.dtype == np.float64


def test_non_finite_weights_are_reported_not_crashed_on():
    model = MyModel().double()
    with torch.no_grad():
        model.block.qk.weight[0, 0] = float("nan")
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    tab = Tracker(model, x, extractors={"block": my_extractor}).record(0)
    assert (tab.status == "non-finite inputs or weights").all() and not tab.feasible.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_tracking_on_cuda_equals_cpu():
    model, inp = MODELS["gpt2"]
    cfg = TrackConfig(max_queries=6, null_draws=1, rot_draws=4)
    cpu = Tracker(model, inp, config=cfg).record(0)
    gpu_model = model.to("cuda")
    try:
        gpu = Tracker(gpu_model, {k: v.to("cuda") for k, v in inp.items()}, config=cfg).record(0)
    finally:
        model.to("cpu")
    for col in ("soft_sparsity", "wqk_norm", "corr_mm", "margin_ratio", "corr_rot_mean"):
        np.testing.assert_allclose(gpu[col], cpu[col], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_sdpa_attention_tracks_like_eager(arch):
    """With sdpa the module returns no probabilities and passes a bool (or no) mask: the
    statistics must equal the eager model's (same weights)."""
    tf = transformers
    ids, mask = _ids()
    tabs = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        if arch == "gpt2":
            m = tf.GPT2Model(tf.GPT2Config(vocab_size=40, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                           attn_implementation=impl, bos_token_id=0, eos_token_id=0))
        else:
            m = tf.BertModel(tf.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=16,
                                           attn_implementation=impl))
        m = _sharpen(m.double().eval())
        tabs[impl] = Tracker(m, dict(input_ids=ids, attention_mask=mask),
                             config=TrackConfig(null_draws=0, rot_draws=2)).record(0)
        assert m.config._attn_implementation == impl  # the probe pass's eager switch is undone
    # the sdpa model is checked too: the tracker's probe pass runs it eagerly
    assert (tabs["sdpa"].recompute_err < 1e-12).all()
    for col in ("soft_sparsity", "n_queries", "corr_mm", "margin_ratio"):
        np.testing.assert_allclose(tabs["sdpa"][col], tabs["eager"][col], rtol=1e-12, atol=1e-12)
