"""What the auxiliary signals cost, and the two choices that cut it (issue 19, point 9): the denoise and
causal passes over a sub-batch (``agent.aux_batch``: rows spread evenly over the batch) and Gradient
Vaccine on the encoder's last layer (``agent.vaccine_scope = "last"``: its extra backward stops there).

Each option's observable move through the trainer on the NumPy backend: the denoise loss and the causal
penalty over the sub-batch are the references computed on those rows (and the causal penalty compares
each row's intervened Q with the clean Q of the same sample); ``aux_batch = 1`` reads the whole batch in
place. The last layer's backward gives the whole backward's gradient of that layer bit for bit and runs
no layer below it. Vaccine's effect on the gradient (scope ``encoder`` and ``last``) is
tests/unit/test_aux_reg.py's ``test_vaccine_changes_only_the_scopes_gradient_by_the_papers_rule``."""

import numpy as np
import pytest
from test_trainer import small
from test_windows import ENCODER_NETS

from cudarl.auxiliary.denoise import STREAM
from cudarl.auxiliary.vaccine import encoder_slice
from cudarl.config import AgentConfig, ConfigError, NetConfig, from_dict
from cudarl.nn import QNetwork
from cudarl.nn.layers import Linear
from cudarl.reference import causal as causal_ref
from cudarl.reference import denoise as denoise_ref
from cudarl.reference.auxgrad import spread
from cudarl.rules.c51 import support
from cudarl.trainer import Trainer


def _trainer(**over) -> Trainer:
    return Trainer(small(**over), run_dir=False, echo=lambda m: None)


def _watch(t: Trainer, name: str, before, after) -> None:
    """Run ``before()`` and ``after()`` around the train graph's phase ``name``."""

    def spy(inner=dict(t.train_graph.phases)[name]):
        before()
        inner()
        after()

    t.train_graph.phases = [(n, spy if n == name else f) for n, f in t.train_graph.phases]


def test_the_options_are_validated_and_the_rows_are_a_ceiling():
    assert AgentConfig().aux_batch == 0.125 and AgentConfig().vaccine_scope == "last"
    assert AgentConfig(batch_size=256).aux_rows == 32
    assert AgentConfig(batch_size=30, aux_batch=0.1).aux_rows == 3  # not 4 from 0.1 * 30 = 3.0000000000000004
    assert AgentConfig(batch_size=32, aux_batch=0.2).aux_rows == 7
    assert AgentConfig(batch_size=5, aux_batch=0.01).aux_rows == 1
    assert AgentConfig(batch_size=7, aux_batch=1.0).aux_rows == 7
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ConfigError, match="aux_batch"):
            from_dict({"agent": {"aux_batch": bad}})
    with pytest.raises(ConfigError, match="vaccine_scope"):
        from_dict({"agent": {"vaccine_scope": "layer"}})


def _net_with(t: Trainer, params, rows: int) -> QNetwork:
    """A network like the trainer's online one (same layout), holding ``params``, with a workspace of ``rows``."""
    net = QNetwork(t.agent.online.n_in, t.agent.online.n_actions, t.cfg.net, max_batch=rows,
                   extra_heads={s.name: s.make_head for s in t.agent.aux})  # fmt: skip
    net.params[...] = params
    net.ws.set_batch(rows)
    return net


@pytest.mark.parametrize("share", [0.25, 1.0])
@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
def test_the_denoise_loss_is_the_reference_over_the_spread_rows(share, encoder):
    t = _trainer(net=ENCODER_NETS[encoder], agent={"aux": ["denoise"], "aux_batch": share, "aux_denoise_lr": 0.01})
    sig, buf, B = t.agent.aux[0], t.agent.buffers, t.cfg.agent.batch_size
    R = t.cfg.agent.aux_rows
    assert R == (B if share == 1.0 else B // 4) and sig.ws.max_batch == R and sig.loss_per.shape == (R,)
    # the whole batch is read in place (no copy: the pass as it ran before aux_batch); a share gathers
    assert (sig.clean is buf.batch.obs) == (share == 1.0)
    seen = {}

    def before():  # what the pass reads: this update's batch, draw counter, encoder and decoder
        seen.update(obs=buf.batch.obs.copy(), counter=sig.counter.copy(), params=t.agent.online.params.copy())
        seen["dec"] = [sig.dec.P[f"{sig.head_name}.{k}"].astype(np.float64) for k in ("weight", "bias")]

    def after():
        seen.update(corrupted=sig.corrupted.copy(), loss=float(sig.out[0]))

    _watch(t, "aux_denoise", before, after)
    t.run(3)  # the third update's pass is the one seen (the SGD steps have moved encoder and decoder)
    clean = seen["obs"][spread(R, B)]
    corrupted = np.empty_like(clean)
    denoise_ref.corrupt(clean, corrupted, seen["counter"], sig.p, sig.seed, STREAM)
    np.testing.assert_array_equal(seen["corrupted"], corrupted)
    net = _net_with(t, seen["params"], R)
    psi = net.encoder.forward(corrupted, net.ws).astype(np.float64)
    W, b = seen["dec"]
    recon = psi @ W + b
    want = np.mean((recon - clean) ** 2)
    np.testing.assert_allclose(seen["loss"], want, rtol=1e-5)
    if share < 1.0:  # the first R rows give another loss: the test tells the rows apart
        assert not np.isclose(np.mean((recon - seen["obs"][:R]) ** 2), want, rtol=1e-3)


@pytest.mark.parametrize("share", [0.25, 1.0])
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_the_causal_penalty_compares_each_spread_rows_intervened_q_with_its_own_clean_q(share, head):
    """Row r of the penalty is Q(do(x)) - Q(x) of one sample: the spread rows of the batch's s, of the
    step's q_s and (IQN) of the taus at s; the loss and the sensitivity are means over those rows."""
    over = {"aux": ["causal"], "aux_batch": share, "causal_weight": 1.0, "causal_groups": ["calendar", "offset"]}
    t = _trainer(net={"head": head}, agent=over)
    sig, buf, B = t.agent.aux[0], t.agent.buffers, t.cfg.agent.batch_size
    R = t.cfg.agent.aux_rows
    assert sig.ws.max_batch == R and sig.d.shape == (R, buf.n_actions) and sig.x.shape[0] == R
    assert (sig.obs is buf.batch.obs and sig.q_s is buf.q_s) == (share == 1.0)
    iqn = head == "iqn"
    taus = f"{buf.online.head.name}.tau"
    seen = {}

    def before():
        seen.update(obs=buf.batch.obs.copy(), q_s=buf.q_s.copy(), counter=sig.counter.copy())
        seen.update(params=buf.online.params.copy(), taus=buf.ws.rows(taus, B).copy() if iqn else None)

    def after():
        seen.update(x=sig.x.copy(), d=sig.d.copy(), loss=float(sig.state[0]))

    _watch(t, "aux_causal", before, after)
    t.run(4)  # the fourth update's pass: the rotation is back at calendar (a swap between rows)
    rows = spread(R, B)
    x = causal_ref.intervene(seen["obs"][rows], sig.mask, sig.mode, seen["counter"], sig.offset, t.cfg.net.window)
    np.testing.assert_array_equal(seen["x"], x)
    net = _net_with(t, seen["params"], R)
    out = net.forward(x, net.ws, **({"tau": seen["taus"][rows]} if iqn else {}))["q"]

    def penalty(q_s):
        if iqn:
            return causal_ref.penalty_quantile(out, q_s, 1.0)[0]
        return causal_ref.penalty_c51(out, q_s, support(t.cfg.net), 1.0)[0]

    d = penalty(seen["q_s"][rows])
    np.testing.assert_array_equal(seen["d"], d)
    np.testing.assert_allclose(seen["loss"], np.mean(d.astype(np.float64) ** 2), rtol=1e-6)
    if share < 1.0:  # against the clean Q of the first rows instead, the penalty would differ
        assert not np.allclose(penalty(seen["q_s"][:R]), d)


@pytest.mark.parametrize(
    "net",
    [
        {"hidden": (6, 5)},
        {"hidden": (6, 5), "layernorm": True},
        {"hidden": (6,)},
        ENCODER_NETS["ssm"],
        ENCODER_NETS["attention"],
    ],
    ids=["mlp", "mlp-layernorm", "mlp-one-layer", "ssm", "attention"],
)
def test_the_last_layers_backward_is_the_whole_backwards_last_layer_and_runs_nothing_below(monkeypatch, rng, net):
    """``QNetwork.backward(last_layer=True)``: the encoder's last layer (``encoder.last_layer``, the last
    entries of the encoder, contiguous) gets the gradient the whole backward gives it, bit for bit, the
    heads theirs, and every other encoder parameter's gradient is left as it was (the padding between
    entries too: NaN here); no Linear below the last layer runs its backward."""
    cfg = NetConfig(**{"window": 7, **net})
    n_in, B = 7 * 5, 9
    q = QNetwork(n_in, 3, cfg, max_batch=B, extra_heads={"aux.h": lambda d: Linear("aux.h", d, 2, act="identity")})
    x = rng.normal(size=(B, n_in)).astype(np.float32)
    douts = None

    def forward_with_gradients():
        nonlocal douts
        q.forward(x)
        outs = q.grad_outputs()
        douts = douts or {k: rng.normal(size=v.shape).astype(np.float32) for k, v in outs.items()}
        for k, v in outs.items():
            v[...] = douts[k]

    forward_with_gradients()
    q.backward(x)
    full = q.grads.copy()
    ran = []
    inner = Linear.backward
    monkeypatch.setattr(Linear, "backward", lambda self, *a, **k: (ran.append(self.name), inner(self, *a, **k))[1])
    q.grads[...] = np.nan
    forward_with_gradients()
    q.backward(x, last_layer=True)
    names = q.encoder.last_layer
    lo, hi = encoder_slice(q.layout, names=names)
    enc_lo, enc_hi = encoder_slice(q.layout)
    assert hi == enc_hi and enc_lo <= lo  # the encoder's last entries
    for e in q.layout.entries:
        got, want = q.G[e.name], full[e.offset : e.offset + e.size].reshape(e.shape)
        if e.name.startswith("enc.") and e.name not in names:
            assert np.isnan(got).all(), e.name  # left as it was
        else:
            np.testing.assert_array_equal(got, want, err_msg=e.name)
    enc_linears = [n for n in q.linears if n.startswith("enc.")]
    assert [n for n in ran if n.startswith("enc.")] == [n for n in enc_linears if f"{n}.weight" in names]
    assert len([n for n in ran if n.startswith("enc.")]) == 1
    if len(cfg.hidden) == 1 and cfg.encoder == "mlp":  # one layer: the last layer is the whole encoder
        assert (lo, hi) == (enc_lo, enc_hi)


def test_vaccine_on_the_last_layer_refuses_a_scope_that_is_not_contiguous():
    from cudarl.nn.params import ParamLayout

    layout = ParamLayout()
    for name in ("enc.0.weight", "other", "enc.1.weight"):
        layout.add(name, (3,))
    with pytest.raises(ValueError, match="not contiguous"):
        encoder_slice(layout, names=["enc.0.weight", "enc.1.weight"])
    with pytest.raises(ValueError, match="no parameter named"):
        encoder_slice(layout, names=["enc.2.weight"])
    assert encoder_slice(layout, names=["enc.1.weight"]) == (layout["enc.1.weight"].offset, layout.size)


# --- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
@pytest.mark.parametrize("old", [False, True], ids=["defaults", "whole-batch-encoder-scope"])
def test_gpu_denoise_causal_vaccine_graphed_equal_eager(encoder, old):
    """The sub-batch passes and the last layer's backward (the defaults), and the whole batch with the whole
    encoder (aux_batch 1, vaccine_scope encoder), captured and replayed, equal the same phases run eagerly."""
    from test_aux_heads import graphed_and_eager

    agent = {"aux": ["horizons", "denoise", "causal", "vaccine"], "aux_denoise_lr": 0.01}
    if old:
        agent.update(aux_batch=1.0, vaccine_scope="encoder")
    g, _ = graphed_and_eager({"net": dict(ENCODER_NETS[encoder]), "agent": agent})
    assert g.agent.aux[1].ws.max_batch == g.cfg.agent.aux_rows
    assert all(np.isfinite(v) for v in g.agent.observables().values())
