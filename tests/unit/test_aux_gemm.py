"""``agent.aux_gemm``: the GEMMs of the denoise and causal passes over their sub-batch (``agent.aux_rows``
rows), apart from the network's ``net.gemm`` (issue 19, point 9: at 64 rows cuBLASLt's one-kernel dx GEMMs
were the causal pass's longest nodes, docs/perf-notes.md, thirty-second session).

CPU: the option is validated, it reaches the layers of causal's own backward (the online network's twin)
and of denoise's encoder and decoder, and nothing else (the step's networks, Gradient Vaccine's backward);
the NumPy backend ignores it (the same bits either way). GPU: the captured train graph launches the panel
GEMMs in those two passes only under ``"cudarl"``, replays bit for bit as the eager phases, and learns the
same weights to float32 rounding as under ``"net"``."""

import dataclasses

import numpy as np
import pytest
from test_trainer import gpu_small, small

from cudarl.config import AUX_GEMMS, ConfigError, from_dict
from cudarl.nn.layers import GEMMS, Linear
from cudarl.nn.network import _walk
from cudarl.trainer import Trainer

SIGNALS = ["horizons", "denoise", "causal", "vaccine"]
OVER = {"aux": SIGNALS, "causal_groups": ["calendar", "offset"], "aux_denoise_lr": 0.01}


def _trainer(cfg) -> Trainer:
    return Trainer(cfg, run_dir=False, echo=lambda m: None)


def _gemms(t: Trainer) -> dict:
    """The ``gemm`` of the layers of each place: the step's networks, causal's and vaccine's own backward,
    denoise's encoder and decoder."""
    sig = {s.name: s for s in t.agent.aux}
    return {
        "online": {lin.gemm for lin in t.agent.online.linears.values()},
        "target": {lin.gemm for lin in t.agent.target.linears.values()},
        "causal": {lin.gemm for lin in sig["causal"].extra.net.linears.values()},
        "vaccine": {lin.gemm for lin in sig["vaccine"].extra.net.linears.values()},
        "denoise": {lin.gemm for lin in _walk([sig["denoise"].enc, sig["denoise"].dec]) if isinstance(lin, Linear)},
    }


def test_the_choices_are_net_and_the_layer_by_layer_gemms():
    assert AUX_GEMMS == ("net", *(g for g in GEMMS if g != "chain"))
    assert from_dict({"agent": {"aux_gemm": "cudarl"}}).agent.aux_gemm == "cudarl"
    with pytest.raises(ConfigError, match="aux_gemm must be one of"):
        from_dict({"agent": {"aux_gemm": "chain"}})


@pytest.mark.parametrize("aux_gemm", ["net", "cudarl", "cublaslt"])
def test_it_reaches_the_sub_batch_passes_layers_only(aux_gemm):
    t = _trainer(small(agent=OVER | {"aux_gemm": aux_gemm}))
    net = t.cfg.net.gemm
    mine = net if aux_gemm == "net" else aux_gemm
    assert _gemms(t) == {"online": {net}, "target": {net}, "causal": {mine}, "vaccine": {net}, "denoise": {mine}}
    panel = aux_gemm == "cudarl"  # the flag the forward and dx read (fp32, ReLU or identity layers)
    causal = next(s for s in t.agent.aux if s.name == "causal")
    assert {lin.panel for lin in causal.extra.net.linears.values()} == {panel}
    assert not any(lin.panel for lin in t.agent.online.linears.values())


def test_the_twin_takes_another_gemm_and_nothing_else():
    online = _trainer(small()).agent.online
    twin = online.twin(dataclasses.replace(online.config, gemm="cudarl"))
    assert {lin.gemm for lin in twin.linears.values()} == {"cudarl"}
    assert twin.params is online.params
    with pytest.raises(ValueError, match="GEMM choices only"):
        online.twin(dataclasses.replace(online.config, hidden=(16, 16)))


def test_the_numpy_backend_trains_the_same_bits_under_every_choice():
    runs = []
    for aux_gemm in ("net", "cudarl"):
        t = _trainer(small(agent=OVER | {"aux_gemm": aux_gemm}))
        t.run(30)
        assert t.step == 30
        runs.append(t)
    np.testing.assert_array_equal(runs[0].agent.online.params, runs[1].agent.online.params)
    assert runs[0].agent.observables() == runs[1].agent.observables()


# --- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_the_panel_gemms_run_in_the_sub_batch_passes_only_under_cudarl():
    from test_aux_branches import traced_train_graph

    names = {}
    for aux_gemm in ("net", "cudarl"):
        nodes, _ = traced_train_graph({"agent": OVER | {"aux_gemm": aux_gemm}})
        names[aux_gemm] = {(n["phase"], n["name"]) for n in nodes}
    panel = {"cudarl_gemm_nt", "cudarl_gemm_nn_bias_act"}
    in_passes = {ph for ph, name in names["cudarl"] if name in panel}
    assert in_passes and in_passes <= {"aux_causal", "aux_causal_do", "aux_denoise"}, in_passes
    assert "aux_causal" in in_passes and "aux_denoise" in in_passes
    assert not {name for _, name in names["net"]} & panel


@pytest.mark.gpu
def test_gpu_graphed_equal_eager_under_cudarl():
    from test_aux_heads import graphed_and_eager

    graphed_and_eager({"agent": OVER | {"aux_gemm": "cudarl"}})  # losses, weights, observables bit for bit


@pytest.mark.gpu
def test_gpu_the_passes_gradients_are_the_net_gemms_to_rounding():
    """One update from the same weights and batch under ``cudarl`` (the panel GEMMs) against ``net``
    (cuBLASLt's): causal's own gradient (its twin's backward), denoise's loss (its encoder's and decoder's
    forward) and its decoder's SGD step (the gradient through that forward) are other sums, and the same
    to float32 rounding."""
    from cudarl.backend import to_numpy

    got = {}
    for aux_gemm in ("net", "cudarl"):
        t = Trainer(gpu_small(agent=OVER | {"aux_gemm": aux_gemm}), run_dir=False, echo=lambda m: None)
        sig = {s.name: s for s in t.agent.aux}
        dec0 = to_numpy(sig["denoise"].dec_params).astype(np.float64)
        t.run(1)
        t.synchronize()
        got[aux_gemm] = {
            "causal gradient": to_numpy(sig["causal"].extra.grads).astype(np.float64),
            "decoder step": to_numpy(sig["denoise"].dec_params).astype(np.float64) - dec0,
            "denoise loss": np.float64(t.agent.observables()["aux.denoise.loss"]),
        }
    for name, want in got["net"].items():
        mine, scale = got["cudarl"][name], float(np.abs(want).max())
        assert scale > 0, name  # the pass ran and wrote it
        assert not np.array_equal(mine, want), name  # other sums: the option reached the pass
        np.testing.assert_allclose(mine, want, rtol=0, atol=1e-5 * scale, err_msg=name)
