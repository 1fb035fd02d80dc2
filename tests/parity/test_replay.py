"""Prioritized replay: the NumPy twin on the CPU (statistics, closed forms, hand cases, state,
bad input) and the CUDA kernels against it on the GPU (streams of calls, graphs)."""

import numpy as np
import pytest
from scipy import stats

from cudarl.reference import replay as ref
from cudarl.replay import Batch, PrioritizedReplay
from cudarl.testing import assert_bitwise, assert_parity


def _rows(rng, B, D, discount=0.9):
    return (
        rng.standard_normal((B, D)).astype(np.float32),
        rng.integers(0, 3, B).astype(np.int32),
        rng.standard_normal(B).astype(np.float32),
        np.full(B, discount, np.float32),
    )


def _cpu(capacity, D=3, n_step=1, **kw):
    return PrioritizedReplay(capacity, D, backend="numpy", n_step=n_step, **kw)


def _filled_skewed(rng, C=10_000, alpha=0.6):
    """C ready rows (n=1, E=1) with heavy-tailed priorities; returns (buffer, p**alpha)."""
    r = _cpu(C + 1, alpha=alpha)
    r.add(*_rows(rng, C + 1, 3))
    td = (rng.pareto(1.2, C) + 1e-3).astype(np.float32)
    r.update_priorities(np.arange(C, dtype=np.int32), td)
    q = r.bufs.tree[:C].astype(np.float64)
    return r, q


def test_window_warps_fit_the_kernels_block():
    """sample_search_gather_windows' groups: a power of two of warps that divides the kernel's SW_THREADS block
    (its shared slots, one a warp), which is the launcher's block; 1 warp for a one-bar window."""
    from cudarl import signatures
    from cudarl.ops import replay as ops

    warps = signatures.define("replay", "SW_THREADS") // 32
    assert warps == ops._WARPS_PER_BLOCK
    got = {w: ops.window_warps(w) for w in (1, 66, 512, 513, 68 * 16, 68 * 64, 68 * 128)}
    assert got[1] == got[66] == got[512] == 1 and got[513] == 2 and got[68 * 64] == warps
    assert all(warps % v == 0 and v & (v - 1) == 0 for v in got.values())


# --- layout and invariants ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "C, sizes", [(1, [32, 1]), (32, [32, 1]), (33, [64, 32, 1]), (1 << 20, [1 << 20, 1 << 15, 1 << 10, 32, 1])]
)
def test_tree_layout_pads_every_level_but_the_root_to_32(C, sizes):
    layout = ref.tree_layout(C)
    assert [s for _, s in layout] == sizes
    assert [o for o, _ in layout] == list(np.concatenate([[0], np.cumsum(sizes)[:-1]]))


def _check_invariants(r):
    C, added = r.capacity, r.added()
    tree = r.bufs.tree.copy()
    ref.refresh(tree, C)
    assert np.array_equal(tree, r.bufs.tree), "internal nodes are not the sums of their children"
    ready = np.zeros(C, bool)
    ready[ref.ready_slots(C, r.spec.lag, added)] = True
    leaves = r.bufs.tree[:C]
    assert np.all(leaves[ready] >= 1) and np.all(leaves[~ready] == 0), "leaf > 0 must mean exactly 'ready'"


def test_ring_wraps_and_only_complete_windows_are_ready(rng):
    r = _cpu(50, n_step=3, n_envs=2)
    for k in range(40):
        r.add(*_rows(rng, 2 * (1 + k % 3), 3))
        _check_invariants(r)
        if k % 5 == 0 and r.ready() >= 8:
            idx, _ = r.sample(8)
            r.update_priorities(idx, rng.standard_normal(8).astype(np.float32))
            _check_invariants(r)
    for added in range(0, 200):
        assert ref.ready_count(50, 6, added) == ref.ready_slots(50, 6, added).size
    assert r.added() > 3 * r.capacity
    assert r.size() == r.capacity and r.ready() == r.capacity - 6


def test_new_rows_get_the_running_maximum_priority(rng):
    r = _cpu(100, n_step=2)
    r.add(*_rows(rng, 10, 3))
    assert np.all(r.bufs.tree[:8] == 1 << 24) and np.all(r.bufs.tree[8:10] == 0)  # initial priority 1.0
    r.update_priorities(np.array([3], np.int32), np.array([99.0], np.float32))
    q_big = ref.priority_to_leaf(np.array([99.0], np.float32), 0.6, 1e-6)[0]
    assert r.bufs.max_q[0] == q_big
    r.add(*_rows(rng, 1, 3))
    assert r.bufs.tree[8] == q_big and r.bufs.tree[9] == 0 and r.bufs.tree[10] == 0


@pytest.mark.parametrize("C", [2, 31, 32, 33, 1000, 1024, 1025, 32 * 1024 + 7])
def test_changed_nodes_list_every_ancestor_of_a_ring_range_once(rng, C):
    """The insert kernel's node spans (one warp per node): for ring ranges that wrap or not, start
    or end on node boundaries, cover the whole ring or one slot, each level lists every ancestor
    of a slot in the range exactly once and nothing else."""
    depth = len(ref.tree_layout(C)) - 1
    cases = {(0, 1), (0, C), (C - 1, 1), (C - 1, C), (C - 1, 2), (1, C - 1), (32 % C, C), (C // 2, C)}
    cases |= {(int(rng.integers(C)), int(rng.integers(1, C + 1))) for _ in range(40)}
    cases |= {
        (s, R) for s in (0, 31 % C, 32 % C, 33 % C) for R in {1, 31, 32, 33, C - 33, C - 32, C - 1, C} if 1 <= R <= C
    }
    for s_lo, R in sorted(cases):
        slots = (s_lo + np.arange(R)) % C
        for k in range(1, depth + 1):
            nodes = ref.changed_nodes(s_lo, R, C, k)
            assert len(np.unique(nodes)) == len(nodes), f"C={C} s_lo={s_lo} R={R} level {k}: a node listed twice"
            assert set(nodes.tolist()) == set((slots >> (5 * k)).tolist()), f"C={C} s_lo={s_lo} R={R} level {k}"
            assert nodes.max() < ref.tree_layout(C)[k][1]


@pytest.mark.parametrize("C, n, E", [(2, 1, 1), (33, 1, 3), (1025, 3, 8), (40_000, 3, 64), (40_000, 1, 1)])
def test_insert_rebuilds_the_ancestors_of_wrapping_inserts_exactly(rng, C, n, E):
    """Inserts of every size from one env-step to the whole ring, wrapping many times, with
    priorities updated between them: the tree stays the exact sum of its leaves (the twin
    rebuilds only the ancestors of the changed range; a full rebuild must agree)."""
    r = _cpu(C, n_step=n, n_envs=E)
    sizes = [E, C - C % E, E * int(rng.integers(1, C // E + 1)), C - C % E - E, 2 * E]
    for k in range(40):
        B = max(E, sizes[k % len(sizes)] if k < len(sizes) else E * int(rng.integers(1, C // E + 1)))
        r.add(*_rows(rng, B, 3))
        _check_invariants(r)
        assert r.bufs.flag[0] == 0
        ready = r.ready()
        if ready >= 4:
            m = min(ready, 64)
            idx, _ = r.sample(m)
            r.update_priorities(idx, (rng.standard_normal(m) * 5).astype(np.float32))
    assert r.added() > 3 * C


# --- sampling statistics ------------------------------------------------------------------------
def test_sampling_frequencies_match_p_alpha_chi_square(rng):
    """χ² goodness of fit, 100 bins of 100 rows sorted by priority, 200 batches of 512: p > 1e-3.
    The same counts against p (alpha = 1, the wrong law) must be rejected (p < 1e-6)."""
    C = 10_000
    r, q = _filled_skewed(rng, C)
    counts = np.zeros(C)
    for _ in range(200):
        idx, _ = r.sample(512)
        counts += np.bincount(idx, minlength=C)
    order = np.argsort(q)
    obs = counts[order].reshape(100, 100).sum(1)
    expected = (q[order] / q.sum()).reshape(100, 100).sum(1) * counts.sum()
    assert stats.chisquare(obs, expected).pvalue > 1e-3
    p_wrong = q ** (1 / 0.6)
    wrong = (p_wrong[order] / p_wrong.sum()).reshape(100, 100).sum(1) * counts.sum()
    assert stats.chisquare(obs, wrong).pvalue < 1e-6
    assert q.max() / q.min() > 50, "priorities are not skewed enough for the test to mean anything"


def test_sample_is_stratified_one_row_per_stratum(rng):
    r, q = _filled_skewed(rng, 2000)
    idx, _ = r.sample(64)
    assert np.all(np.diff(idx) >= 0), "stratum j's row never precedes stratum j-1's"
    incl = np.cumsum(q)
    T = incl[-1]
    strata = ((incl[idx] - 1) * 64 // T).astype(int)  # the stratum of each row's last unit
    first = ((incl[idx] - q[idx]) * 64 // T).astype(int)
    assert np.all((first <= np.arange(64)) & (np.arange(64) <= strata))


def test_two_samples_differ_and_the_same_step_repeats(rng):
    r, _ = _filled_skewed(rng, 2000)
    state = r.state_dict()
    a = r.sample(32)[0].copy()
    b = r.sample(32)[0].copy()
    assert not np.array_equal(a, b)
    r.load_state_dict(state)
    assert np.array_equal(r.sample(32)[0], a)


def test_importance_weights_match_the_closed_form_and_beta_anneals(rng):
    r = _cpu(2001, beta0=0.4, beta_final=1.0, beta_steps=10)
    r.add(*_rows(rng, 2001, 3))
    r.update_priorities(np.arange(2000, dtype=np.int32), (rng.pareto(1.5, 2000) + 0.01).astype(np.float32))
    p = r.priorities()[:2000]
    P, N = p / p.sum(), 2000
    for step in range(14):
        idx, w = r.sample(256)
        beta = 0.4 + 0.6 * min(1.0, step / 10)
        assert r.bufs.beta[0] == pytest.approx(beta, rel=1e-15)
        raw = (N * P[idx]) ** -beta
        assert_parity(w, (raw / raw.max()).astype(np.float32), rtol=1e-6, what=f"weights at step {step}")
        assert w.max() == 1.0


# --- n-step returns -----------------------------------------------------------------------------
def test_n_step_hand_case_with_an_episode_ending_inside_the_window():
    r = _cpu(20, D=2, n_step=3)
    rew = np.array([1, 2, 4, 8, 16, 32, 64], np.float32)
    disc = np.array([0.9, 0.9, 0.0, 0.9, 0.9, 0.9, 0.9], np.float32)  # the episode ends after step 2
    obs = np.arange(14, dtype=np.float32).reshape(7, 2)
    r.add(obs, np.arange(7, dtype=np.int32), rew, disc)
    b = r.gather(np.array([0, 1, 2, 3], np.int32))
    np.testing.assert_allclose(b.ret, [1 + 0.9 * 2 + 0.81 * 4, 2 + 0.9 * 4, 4, 8 + 0.9 * 16 + 0.81 * 32], rtol=1e-6)
    np.testing.assert_allclose(b.discount, [0, 0, 0, 0.9**3], rtol=1e-6)
    assert b.obs.shape == (4, 2) and b.next_obs.shape == (4, 2)
    assert np.array_equal(b.obs, obs[:4]) and np.array_equal(b.next_obs, obs[3:7])
    assert np.array_equal(b.action, [0, 1, 2, 3])


def test_n_step_walks_each_environment_separately(rng):
    E = 3
    r = _cpu(60, D=1, n_step=2, n_envs=E)
    for t in range(4):  # env e's reward at time t is 10*e + t
        r.add(
            np.full((E, 1), t, np.float32),
            np.zeros(E, np.int32),
            (10 * np.arange(E) + t).astype(np.float32),
            np.array([0.5, 0.0, 0.5], np.float32) if t == 0 else np.full(E, 0.5, np.float32),
        )
    b = r.gather(np.array([0, 1, 2, 3], np.int32))  # time 0 of envs 0..2, time 1 of env 0
    np.testing.assert_allclose(b.ret, [0 + 0.5 * 1, 10, 20 + 0.5 * 21, 1 + 0.5 * 2])
    np.testing.assert_allclose(b.discount, [0.25, 0.0, 0.25, 0.25])
    assert np.array_equal(b.next_obs[:, 0], [2, 2, 2, 3])


def test_n_step_with_n_one_equals_the_one_step_transition(rng):
    r = _cpu(40, D=4, n_step=1)
    o, a, rew, d = _rows(rng, 30, 4, discount=0.97)
    d[::7] = 0
    r.add(o, a, rew, d)
    idx = np.arange(29, dtype=np.int32)
    b = r.gather(idx)
    assert np.array_equal(b.ret, rew[:29]) and np.array_equal(b.discount, d[:29])
    assert np.array_equal(b.next_obs, o[1:30]) and np.array_equal(b.obs, o[:29])


# --- priority updates ---------------------------------------------------------------------------
def test_duplicate_indices_last_occurrence_wins_and_unready_rows_are_kept(rng):
    r = _cpu(100, n_step=2)
    r.add(*_rows(rng, 20, 3))
    r.update_priorities(np.array([5, 7, 5, 19, 5], np.int32), np.array([1.0, 2.0, 3.0, 4.0, 0.5], np.float32))
    leaf = lambda td: ref.priority_to_leaf(np.array([td], np.float32), 0.6, 1e-6)[0]  # noqa: E731
    assert r.bufs.tree[5] == leaf(0.5) and r.bufs.tree[7] == leaf(2.0)
    assert r.bufs.tree[19] == 0, "row 19 is not ready (its bootstrap row does not exist yet)"
    assert r.bufs.max_q[0] == max(1 << 24, leaf(2.0))
    _check_invariants(r)


def test_device_rules_of_the_twin_skip_bad_td_and_bad_rows(rng):
    """What the kernels do with values no host checked: the twin's ops, called directly."""
    r = _cpu(64)
    r.add(*_rows(rng, 10, 3))
    before = r.state_dict()
    ref.update_priorities(
        r.spec, r.bufs, np.array([2, 3, 99, 2], np.int32), np.array([5.0, np.nan, 1.0, np.inf], np.float32)
    )
    assert r.bufs.tree[3] == before["priorities"][3] and r.bufs.tree[2] == before["priorities"][2]
    assert set(r.status()) == {"non-finite td skipped", "out-of-range index skipped"}
    o, a, rew, d = _rows(rng, 4, 3)
    rew[2] = np.nan
    ref.insert(r.spec, r.bufs, o, a, rew, d)
    after = r.state_dict()
    for k in ("obs", "action", "reward", "discount", "priorities"):
        assert np.array_equal(after[k], before[k]), k
    assert after["added"] == before["added"] and "bad rows rejected" in r.status()
    r.clear_status()
    r.reserve(3)
    out = r._batches[3][3]
    ref.gather(r.spec, r.bufs, np.array([1, 64, -2], np.int32), *out)
    assert r.status() == ["out-of-range index skipped"]
    assert np.all(out.obs[1:] == 0) and np.all(out.next_obs[1:] == 0) and np.all(out.ret[1:] == 0)
    assert np.array_equal(out.obs[0], r.bufs.obs[1]) and out.ret[0] == r.bufs.reward[1]


# --- state ----------------------------------------------------------------------------------------
def _round_trip(rng, kw: dict, rows, field: str):
    """Fill a CPU buffer (``rows(rng, B, D)`` per add) with samples and updates, load its state into a
    fresh one, and check both states match and both resume alike (the same sample, the same gathered
    ``field``). Returns the state."""
    r = _cpu(80, **kw)
    for _ in range(50):
        r.add(*rows(rng, 4, 3))
        if r.ready() >= 16:
            idx, _ = r.sample(16)
            r.update_priorities(idx, rng.standard_normal(16).astype(np.float32))
    state = r.state_dict()
    r2 = _cpu(80, **kw)
    r2.load_state_dict(state)
    s2 = r2.state_dict()
    assert state.keys() == s2.keys()
    for k in state:
        assert np.array_equal(state[k], s2[k]), k
    assert np.array_equal(r.bufs.tree, r2.bufs.tree)
    new = rows(rng, 4, 3)
    for buf in (r, r2):
        buf.add(*new)
    i1, w1 = r.sample(16)
    i2, w2 = r2.sample(16)
    assert np.array_equal(i1, i2) and np.array_equal(w1, w2)
    assert_bitwise(getattr(r.gather(i1), field), getattr(r2.gather(i2), field))
    return state


def test_state_round_trips_and_resumes_identically(rng):
    _round_trip(rng, dict(n_step=3, n_envs=2, seed=7), _rows, "ret")


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [0, -5, 2.5, True])
def test_bad_capacity_names_the_argument(capacity):
    with pytest.raises(ValueError, match="capacity"):
        _cpu(capacity)


def _bad_calls(rng):
    o, a, rew, d = _rows(rng, 4, 3)
    nan_r, inf_o, big_d, neg_a = rew.copy(), o.copy(), d.copy(), a.copy()
    nan_r[1], inf_o[2, 1], big_d[0], neg_a[3] = np.nan, np.inf, 1.5, -1
    nan_td = np.ones(4, np.float32)
    nan_td[2] = np.nan
    neg_state = lambda r: {**r.state_dict(), "priorities": -r.state_dict()["priorities"]}  # noqa: E731
    nan_state = lambda r: {**r.state_dict(), "obs": np.full_like(r.state_dict()["obs"], np.nan)}  # noqa: E731
    return {
        "obs dtype": ("obs", lambda r: r.add(o.astype(np.float64), a, rew, d)),
        "obs shape": ("obs", lambda r: r.add(o[:, :2], a, rew, d)),
        "action dtype": ("action", lambda r: r.add(o, a.astype(np.int64), rew, d)),
        "reward shape": ("reward", lambda r: r.add(o, a, rew[:3], d)),
        "NaN reward": ("reward", lambda r: r.add(o, a, nan_r, d)),
        "inf obs": ("obs", lambda r: r.add(inf_o, a, rew, d)),
        "discount > 1": ("discount", lambda r: r.add(o, a, rew, big_d)),
        "negative action": ("action", lambda r: r.add(o, neg_a, rew, d)),
        "batch too large": ("batch_size", lambda r: r.sample(30)),
        "batch zero": ("batch_size", lambda r: r.sample(0)),
        "NaN td": ("td", lambda r: r.update_priorities(np.arange(4, dtype=np.int32), nan_td)),
        "td dtype": ("td", lambda r: r.update_priorities(np.arange(4, dtype=np.int32), nan_td.astype(np.float64))),
        "index range": (
            "indices",
            lambda r: r.update_priorities(np.array([0, 1, 2, 64], np.int32), np.ones(4, np.float32)),
        ),
        "index dtype": ("indices", lambda r: r.update_priorities(np.arange(4), np.ones(4, np.float32))),
        "negative priorities": ("priorities", lambda r: r.load_state_dict(neg_state(r))),
        "NaN state obs": ("obs", lambda r: r.load_state_dict(nan_state(r))),
    }


@pytest.mark.parametrize("case", list(_bad_calls(np.random.default_rng(0))))
def test_bad_input_raises_naming_the_argument_and_changes_nothing(rng, case):
    name, call = _bad_calls(rng)[case]
    _refused_and_unchanged(rng, _cpu(64), _rows(rng, 20, 3), name, call, case)


def _refused_and_unchanged(rng, r, rows, name, call, case) -> None:
    """Fill ``r`` with ``rows`` and some priorities; ``call(r)`` must raise naming ``name`` and change nothing."""
    r.add(*rows)
    r.update_priorities(np.arange(10, dtype=np.int32), rng.standard_normal(10).astype(np.float32))
    before = r.state_dict()
    with pytest.raises(ValueError, match=name):
        call(r)
    after = r.state_dict()
    for k in before:
        assert np.array_equal(before[k], after[k]), f"{case}: {k} changed"
    _check_invariants(r)


# --- GPU ------------------------------------------------------------------------------------------
def _pair(capacity, D, n_step=1, **kw):
    kw["n_step"] = n_step
    return (PrioritizedReplay(capacity, D, backend="cupy", **kw), PrioritizedReplay(capacity, D, backend="numpy", **kw))


def _assert_same_state(gpu, cpu, what):
    g, c = gpu.state_dict(), cpu.state_dict()
    for k in c:
        assert np.array_equal(np.asarray(g[k]), np.asarray(c[k])), f"{what}: state[{k!r}] differs"
    assert_bitwise(gpu.bufs.tree, cpu.bufs.tree, what=f"{what}: whole tree")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "C, D, n, E, B, add_rows", [(1000, 5, 3, 4, 64, 24), (777, 1, 1, 1, 33, 13), ((1 << 20) + 7, 64, 3, 1, 512, 30_000)]
)
def test_gpu_stream_of_add_sample_update_matches_the_twin(cp, rng, C, D, n, E, B, add_rows):
    """100 steps of add / sample / gather / update (with duplicate indices): indices, gathered rows
    and n-step targets identical, weights within 1e-6, the whole tree and every counter identical."""
    kw = dict(n_step=n, n_envs=E, seed=int(rng.integers(1 << 62)), beta_steps=50)
    gpu, cpu = _pair(C, D, **kw)
    add_rows -= add_rows % E
    step = 0
    while step < 100:
        o, a, rew, d = _rows(rng, add_rows, D)
        d[rng.random(add_rows) < 0.05] = 0.0
        cpu.add(o, a, rew, d)
        gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d))
        if cpu.ready() < B:
            continue
        ic, bc = _samples_agree(cpu, gpu, B, step)
        td = (rng.standard_normal(B) * rng.pareto(1.0, B)).astype(np.float32)
        upd = ic.copy()
        upd[: B // 4] = upd[B // 4 : B // 2]  # duplicates: the later occurrence must win
        cpu.update_priorities(upd, td)
        gpu.update_priorities(cp.asarray(upd), cp.asarray(td))
        step += 1
    _assert_same_state(gpu, cpu, "after 100 steps")
    assert np.all(gpu.bufs.owner.get() == -1), "update_priorities left its scratch dirty"
    assert gpu.status() == [] and float(gpu.bufs.beta.get()[0]) == cpu.bufs.beta[0]


def _assert_insert_state(gpu, cpu, what):
    """Rings, priorities, counters and the whole tree equal the twin's; the reject flag equals
    the twin's and both arrival counters of the insert kernels are back to 0."""
    _assert_same_state(gpu, cpu, what)
    flag = gpu.bufs.flag.get()
    assert flag.tolist() == [int(cpu.bufs.flag[0]), 0, 0], f"{what}: flag words {flag.tolist()}"


def _insert_sizes(rng, C, E):
    """One env-step, the whole ring (rounded to E), random sizes, the ring less one step, two steps."""
    full = C - C % E
    return [E, full, E * int(rng.integers(1, C // E + 1)), max(E, full - E), 2 * E]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "C, D, n, E, store_next",
    [
        (2, 1, 1, 1, False),
        (33, 3, 1, 3, False),
        (1025, 5, 3, 8, False),
        (1025, 5, 1, 8, True),
        ((1 << 15) + 3, 16, 3, 64, False),
        ((1 << 20) + 7, 8, 3, 4096, False),
        ((1 << 20) + 7, 8, 1, 4096, True),
    ],
)
def test_gpu_insert_matches_the_twin_through_wrapping_inserts(cp, rng, C, D, n, E, store_next):
    """Inserts from one env-step up to the whole ring, wrapping at least three times, with
    priorities changed in between (so max_q and the leaves vary) and one batch with a NaN reward
    (rejected on the device): after every insert the rings, the whole tree and the counters equal
    the twin's bitwise and the insert kernels' arrival counters are back to 0."""
    kw = dict(n_step=n, n_envs=E, seed=3, store_next_obs=store_next)
    gpu, cpu = _pair(C, D, **kw)
    sizes = _insert_sizes(rng, C, E)
    k = 0
    while k < 12 or cpu.added() <= 3 * C:
        B = sizes[k] if k < len(sizes) else E * int(rng.integers(1, C // E + 1))
        rows = list(_rows_next(rng, B, D) if store_next else _rows(rng, B, D))
        if k == 6:
            rows[2][B // 2] = np.nan  # only the device sees it: the whole batch is rejected
        ref.insert(cpu.spec, cpu.bufs, *rows[:4], rows[4] if store_next else None)
        gpu.add(*(cp.asarray(x) for x in rows))
        _assert_insert_state(gpu, cpu, f"insert {k} of {B} rows")
        if k == 6:
            assert gpu.status() == ["bad rows rejected"] and cpu.bufs.flag[0] == 1
            gpu.clear_status()
            cpu.clear_status()
        idx = rng.integers(0, C, 64).astype(np.int32)  # rows not ready are left alone, on both
        td = (rng.standard_normal(64) * rng.pareto(1.0, 64)).astype(np.float32)
        cpu.update_priorities(idx, td)
        gpu.update_priorities(cp.asarray(idx), cp.asarray(td))
        k += 1
    _assert_insert_state(gpu, cpu, "after the inserts and updates")


@pytest.mark.gpu
def test_gpu_insert_graphed_equals_eager_and_the_twin(cp, rng):
    """The collect step's insert: 4096 rows of 66 floats, n = 3 (lag 12288), a 50k ring that
    wraps every ~12 inserts. One graph captured once; new rows are written into its input buffers
    between replays (one batch has a NaN reward and is rejected on the device). After every replay
    the graphed buffer, an eager buffer fed the same rows and the twin agree bitwise."""
    from cudarl.graph import StepGraph

    E, D, C = 4096, 66, 50_000
    kw = dict(n_step=3, n_envs=E, seed=2)
    graphed, eager = (PrioritizedReplay(C, D, backend="cupy", **kw) for _ in range(2))
    cpu = _cpu(C, D=D, **kw)
    inputs = [cp.zeros((E, D), cp.float32), cp.zeros(E, cp.int32), cp.zeros(E, cp.float32), cp.zeros(E, cp.float32)]
    g = StepGraph("replay_insert_graphed", [("insert", lambda: graphed.add(*inputs))], xp=cp)
    g.capture()
    for k in range(30):
        rows = list(_rows(rng, E, D))
        if k == 9:
            rows[2][17] = np.nan
        for dst, x in zip(inputs, rows, strict=True):
            dst.set(x)
        cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        eager.add(*inputs)
        ref.insert(cpu.spec, cpu.bufs, *rows)
        _assert_insert_state(graphed, cpu, f"replay {k}")
        _assert_insert_state(eager, cpu, f"eager insert {k}")
        if k == 9:
            assert graphed.status() == eager.status() == ["bad rows rejected"]
            for r in (graphed, eager, cpu):
                r.clear_status()
    assert graphed.added() == 29 * E


def _samples_agree(cpu, gpu, B, step):
    """Sample ``B`` rows from the twin and the GPU buffer: indices equal, weights to 1e-6, gathered
    batches bit for bit. On odd steps the GPU searches and gathers in one launch (``sample(out=)``).
    Returns the twin's indices and batch."""
    ic, wc = cpu.sample(B)
    bc = cpu.gather(ic)
    if step % 2:
        bg = Batch(*(gpu.xp.zeros(x.shape, x.dtype) for x in bc))
        ig, wg = gpu.sample(B, out=bg)
    else:
        ig, wg = gpu.sample(B)
        bg = gpu.gather(ig)
    assert_bitwise(ig, ic, what=f"indices at step {step}")
    assert_parity(wg, wc, rtol=1e-6, what=f"weights at step {step}")
    for name, x, y in zip(bc._fields, bg, bc, strict=True):
        assert_bitwise(x, y, what=f"gather {name} at step {step}")
    return ic, bc


def test_sample_with_out_gathers_what_sample_then_gather_would(rng):
    kw = dict(n_step=3, n_envs=4, seed=11)
    one, two = _cpu(500, 5, **kw), _cpu(500, 5, **kw)
    rows = _rows(rng, 400, 5)
    one.add(*rows)
    two.add(*rows)
    for _ in range(3):
        i1, w1 = one.sample(64)
        b1 = one.gather(i1)
        b2 = Batch(*(np.zeros(x.shape, x.dtype) for x in b1))
        i2, w2 = two.sample(64, out=b2)
        assert_bitwise(i2, i1, what="indices")
        assert_bitwise(w2, w1, what="weights")
        for name, x, y in zip(b1._fields, b2, b1, strict=True):
            assert_bitwise(x, y, what=f"gathered {name}")
    with pytest.raises(ValueError, match="out.obs"):
        two.sample(64, out=Batch(np.zeros((64, 2), np.float32), *b2[1:]))


def _replays_equal_eager_runs(eager, graphed, bufs, B, steps: int = 5) -> None:
    """Capture ``graphed``; ``steps`` times run ``eager`` and replay ``graphed`` and compare the sampled
    indices, weights, qsel and gathered batch of ``bufs[0]`` (eager) and ``bufs[1]`` (graphed) bit for bit."""
    graphed.capture()
    for k in range(steps):
        eager.run_eager()
        graphed.replay()
        eager.synchronize()
        graphed.synchronize()
        out_e, out_g = bufs[0]._batches[B], bufs[1]._batches[B]
        for name, x, y in zip(("indices", "weights", "qsel"), out_g[:3], out_e[:3], strict=True):
            assert_bitwise(x, y, what=f"step {k} {name}")
        for name, x, y in zip(out_e[3]._fields, out_g[3], out_e[3], strict=True):
            assert_bitwise(x, y, what=f"step {k} gather {name}")


def _graph_step(buf, B, td):
    def step():
        idx, _ = buf.sample(B)
        buf.gather(idx)
        buf.update_priorities(idx, td)

    return step


@pytest.mark.gpu
def test_gpu_graph_captured_small_samples_rows_added_later_and_replays_differ(cp, rng):
    from cudarl.graph import StepGraph

    B = 32
    gpu, cpu = _pair(4096, 4, n_step=2, seed=11)
    o, a, rew, d = _rows(rng, 100, 4)
    cpu.add(o, a, rew, d)
    gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d))
    td_np = (rng.random(B) * 0.01).astype(np.float32)  # small: sampled rows sink below the newcomers
    td = cp.asarray(td_np)
    gpu.reserve(B)
    cp.cuda.Device().synchronize()
    g = StepGraph("replay_growth", [("per", _graph_step(gpu, B, td))], xp=cp)
    g.capture()
    seen = []
    for k in range(6):
        if k == 2:  # grow after the capture: 3000 more rows at the running max priority
            g.synchronize()
            o, a, rew, d = _rows(rng, 3000, 4)
            cpu.add(o, a, rew, d)
            gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d))
            cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        got = gpu._batches[B][0].get().copy()
        idx, _ = cpu.sample(B)
        cpu.gather(idx)
        cpu.update_priorities(idx, td_np)
        assert_parity(got, idx, what=f"replay {k} indices")
        seen.append(got)
    assert np.all(np.concatenate(seen[:2]) < 98), "before growth only rows 0..97 are ready"
    assert np.mean(np.concatenate(seen[2:]) >= 98) > 0.5, "a graph captured before growth must sample the new rows"
    assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[3], seen[4]), (
        "two replays drew the same rows"
    )
    _assert_same_state(gpu, cpu, "after graph replays")


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise(cp, rng):
    from cudarl.graph import StepGraph

    B = 128
    bufs = []
    o, a, rew, d = _rows(rng, 3000, 16)
    for _ in range(2):
        r = PrioritizedReplay(5000, 16, n_step=3, seed=3, backend="cupy")
        r.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d))
        r.reserve(B)
        bufs.append(r)
    td = cp.asarray(rng.standard_normal(B).astype(np.float32))
    cp.cuda.Device().synchronize()
    eager = StepGraph("replay_eager_twin", [("per", _graph_step(bufs[0], B, td))], xp=cp)
    graphed = StepGraph("replay_graphed", [("per", _graph_step(bufs[1], B, td))], xp=cp)
    _replays_equal_eager_runs(eager, graphed, bufs, B)
    assert_bitwise(bufs[1].bufs.tree, bufs[0].bufs.tree, what="tree")
    assert_bitwise(bufs[1]._scalars.buffer, bufs[0]._scalars.buffer, what="counters")


@pytest.mark.gpu
def test_gpu_device_rules_match_the_twin(cp, rng):
    """Values only the device sees: NaN/inf td and out-of-range indices are skipped with status
    bits, a batch with a NaN reward is rejected whole, a sample of an empty buffer is flagged."""
    gpu, cpu = _pair(64, 3)
    for buf in (gpu, cpu):  # sample() refuses an empty buffer on the host; the op itself must cope
        buf.reserve(8)
        idx, w, qsel, _ = buf._batches[8]
        buf._ops.sample(buf.spec, buf.bufs, idx, w, qsel)
        assert buf.status() == ["sampled an empty buffer"] and np.all(
            np.asarray(w.get() if hasattr(w, "get") else w) == 0
        )
        buf.clear_status()
    o, a, rew, d = _rows(rng, 10, 3)
    cpu.add(o, a, rew, d)
    gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d))
    bad_idx = np.array([2, 3, 99, 2, -1, 4, 4], np.int32)
    bad_td = np.array([5.0, np.nan, 1.0, np.inf, 1.0, 2.0, 0.25], np.float32)
    ref.update_priorities(cpu.spec, cpu.bufs, bad_idx, bad_td)
    gpu.update_priorities(cp.asarray(bad_idx), cp.asarray(bad_td))
    rew[2] = np.nan
    ref.insert(cpu.spec, cpu.bufs, o, a, rew, d)
    gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d))
    bad_rows = np.array([1, 64, -2, 5], np.int32)
    cpu.reserve(4)
    ref.gather(cpu.spec, cpu.bufs, bad_rows, *cpu._batches[4][3])
    got = gpu.gather(cp.asarray(bad_rows))  # a CuPy argument: checked on the device
    for name, x, y in zip(got._fields, got, cpu._batches[4][3], strict=True):
        assert_bitwise(x, y, what=f"gather {name} with out-of-range rows")
    _assert_same_state(gpu, cpu, "after bad device input")
    assert set(gpu.status()) == {"non-finite td skipped", "out-of-range index skipped", "bad rows rejected"}


@pytest.mark.gpu
def test_gpu_state_round_trip_rebuilds_the_tree(cp, rng):
    gpu, cpu = _pair(3000, 2, n_step=2, n_envs=2, seed=5)
    for _ in range(10):
        o, a, rew, d = _rows(rng, 400, 2)
        cpu.add(o, a, rew, d)
        idx, _ = cpu.sample(64)
        cpu.update_priorities(idx, rng.standard_normal(64).astype(np.float32))
    gpu.load_state_dict(cpu.state_dict())
    _assert_same_state(gpu, cpu, "loaded")
    ig, wg = gpu.sample(64)
    ic, wc = cpu.sample(64)
    assert_parity(ig, ic, what="first sample after load")
    assert_parity(wg, wc, rtol=1e-6, what="weights after load")


# --- stored next observations (store_next_obs) ------------------------------------------------------
def _rows_next(rng, B, D, discount=0.9):
    """Rows plus a next observation that is no other row's obs (so a wrong source cannot match)."""
    return (*_rows(rng, B, D, discount), (100.0 + rng.standard_normal((B, D))).astype(np.float32))


def test_store_next_obs_rows_are_ready_at_once_and_gather_returns_the_stored_next_obs(rng):
    r = _cpu(40, D=3, n_envs=2, store_next_obs=True)
    o, a, rew, d, nx = _rows_next(rng, 6, 3)
    d[4] = 0.0
    r.add(o, a, rew, d, nx)
    assert r.ready() == 6 and np.all(r.bufs.tree[:6] == 1 << 24) and np.all(r.bufs.tree[6:40] == 0)
    _check_invariants(r)
    b = r.gather(np.arange(6, dtype=np.int32))
    assert np.array_equal(b.next_obs, nx) and np.array_equal(b.obs, o) and np.array_equal(b.action, a)
    assert np.array_equal(b.ret, rew) and np.array_equal(b.discount, d)
    idx, w = r.sample(6)  # every row, the last one included, can be drawn right away
    assert np.all(idx < 6) and np.all(w > 0)


def test_store_next_obs_ring_wraps_and_every_held_row_stays_ready(rng):
    r = _cpu(25, D=2, store_next_obs=True)
    held_next = np.zeros((25, 2), np.float32)
    added = 0
    for k in range(30):
        o, a, rew, d, nx = _rows_next(rng, 1 + k % 4, 2)
        r.add(o, a, rew, d, nx)
        held_next[(added + np.arange(len(a))) % 25] = nx
        added += len(a)
        _check_invariants(r)
        assert r.ready() == min(added, 25)
        if r.ready() >= 8:
            idx, _ = r.sample(8)
            r.update_priorities(idx, rng.standard_normal(8).astype(np.float32))
            _check_invariants(r)
    b = r.gather(np.arange(25, dtype=np.int32))
    assert np.array_equal(b.next_obs, held_next)


def test_store_next_obs_keeps_counterfactual_and_mirror_rows_of_the_env():
    """The env's record() rows: group 0 real, then counterfactual actions, then the mirror. Their
    next observations carry each group's own position, which no later row of the ring holds."""
    from cudarl.env import EnvConfig, TradingEnv

    rng = np.random.default_rng(3)
    t_n, f_n = 60, 4
    close = (50 * np.exp(np.cumsum(rng.normal(0, 0.02, t_n)))).astype(np.float32)
    feats = rng.normal(size=(t_n, f_n)).astype(np.float32)
    cfg = EnvConfig(n_envs=5, n_actions=3, episode_len=4, counterfactual=True, mirror=True)
    env = TradingEnv(close * 1.001, close, feats, np.arange(f_n) % 2 == 0, cfg, backend="numpy")
    out = env.make_transitions()
    M = out.action.shape[0]
    assert M == env.rows_per_step * env.n_envs and env.rows_per_step == 4
    r = PrioritizedReplay(10 * M, env.windows.state_dim, n_step=1, n_envs=M, store_next_obs=True, backend="numpy")
    old = PrioritizedReplay(
        10 * M, env.windows.state_dim, n_step=1, n_envs=M, backend="numpy"
    )  # next row of the column
    recorded = []
    for _ in range(6):
        a = rng.integers(0, 3, env.n_envs).astype(np.int32)
        env.record(out, a)
        disc = (0.99 * (1 - out.done)).astype(np.float32)
        r.add(out.obs, out.action, out.reward, disc, out.next_obs)
        old.add(out.obs, out.action, out.reward, disc)
        recorded.append(out.next_obs.copy())
        env.step(a)
    assert r.ready() == 6 * M and old.ready() == 5 * M
    idx = np.arange(5 * M, dtype=np.int32)
    got, ring = r.gather(idx).next_obs, old.gather(idx).next_obs
    assert np.array_equal(got, np.concatenate(recorded[:5]))
    cf = np.arange(5 * M) % M >= env.n_envs  # counterfactual and mirror rows
    assert np.any(got[cf] != ring[cf]), "the test needs rows whose next state is not the next row"


def test_store_next_obs_refuses_n_step_other_than_one():
    with pytest.raises(ValueError, match="store_next_obs.*n_step"):
        _cpu(64, n_step=3, store_next_obs=True)
    with pytest.raises(ValueError, match="store_next_obs"):
        _cpu(64, store_next_obs="yes")
    with pytest.raises(ValueError, match="store_next_obs"):
        ref.ReplaySpec(64, 3, 2, 1, 0.6, 1e-6, 0.4, 1.0, 10, 0, 0, store_next_obs=True)


def _bad_next_calls(rng):
    o, a, rew, d, nx = _rows_next(rng, 4, 3)
    nan_nx = nx.copy()
    nan_nx[1, 2] = np.nan
    no_next = lambda r: {k: v for k, v in r.state_dict().items() if k != "next_obs"}  # noqa: E731
    nan_state = lambda r: {**r.state_dict(), "next_obs": np.full((64, 3), np.nan, np.float32)}  # noqa: E731
    return {
        "next_obs missing": ("next_obs", lambda r: r.add(o, a, rew, d)),
        "next_obs dtype": ("next_obs", lambda r: r.add(o, a, rew, d, nx.astype(np.float64))),
        "next_obs shape": ("next_obs", lambda r: r.add(o, a, rew, d, nx[:3])),
        "NaN next_obs": ("next_obs", lambda r: r.add(o, a, rew, d, nan_nx)),
        "NaN reward": ("reward", lambda r: r.add(o, a, np.full(4, np.nan, np.float32), d, nx)),
        "state without next_obs": ("next_obs", lambda r: r.load_state_dict(no_next(r))),
        "NaN state next_obs": ("next_obs", lambda r: r.load_state_dict(nan_state(r))),
        "state of the other mode": ("store_next_obs", lambda r: r.load_state_dict(_filled_default(r))),
    }


def _filled_default(r):
    other = _cpu(64)
    other.add(*_rows(np.random.default_rng(1), 20, 3))
    return {**other.state_dict(), "next_obs": r.state_dict()["next_obs"]}


@pytest.mark.parametrize("case", list(_bad_next_calls(np.random.default_rng(0))))
def test_store_next_obs_bad_input_raises_naming_the_argument_and_changes_nothing(rng, case):
    name, call = _bad_next_calls(rng)[case]
    _refused_and_unchanged(rng, _cpu(64, store_next_obs=True), _rows_next(rng, 20, 3), name, call, case)


def test_next_obs_is_refused_by_a_buffer_that_does_not_store_it(rng):
    r = _cpu(64)
    with pytest.raises(ValueError, match="next_obs"):
        r.add(*_rows_next(rng, 4, 3))
    assert r.added() == 0 and "store_next_obs" not in r.state_dict() and r.bufs.next_obs is None


def test_store_next_obs_twin_rejects_a_batch_with_non_finite_next_obs(rng):
    """The device rule, on the twin's ops: the whole batch is rejected, status bit set."""
    r = _cpu(64, store_next_obs=True)
    r.add(*_rows_next(rng, 10, 3))
    before = r.state_dict()
    o, a, rew, d, nx = _rows_next(rng, 4, 3)
    nx[3, 0] = np.inf
    ref.insert(r.spec, r.bufs, o, a, rew, d, nx)
    after = r.state_dict()
    for k in before:
        if k != "status":
            assert np.array_equal(before[k], after[k]), k
    assert r.status() == ["bad rows rejected"]


def test_store_next_obs_state_round_trips_and_resumes_identically(rng):
    state = _round_trip(rng, dict(n_envs=2, seed=9, store_next_obs=True), _rows_next, "next_obs")
    assert state["store_next_obs"] is True and state["next_obs"].shape == (80, 3)
    with pytest.raises(ValueError, match="store_next_obs"):
        _cpu(80, n_envs=2).load_state_dict(state)


@pytest.mark.gpu
@pytest.mark.parametrize("C, D, E, B, add_rows", [(1000, 5, 4, 64, 24), (777, 1, 1, 33, 13), (5003, 64, 12, 512, 1200)])
def test_gpu_store_next_obs_stream_matches_the_twin(cp, rng, C, D, E, B, add_rows):
    """40 steps of add (with next_obs) / sample / gather / update: indices and gathered rows
    identical, weights within 1e-6, tree, rings and counters identical."""
    kw = dict(n_envs=E, seed=int(rng.integers(1 << 62)), beta_steps=30, store_next_obs=True)
    gpu, cpu = _pair(C, D, **kw)
    add_rows -= add_rows % E
    step = 0
    while step < 40:
        o, a, rew, d, nx = _rows_next(rng, add_rows, D)
        d[rng.random(add_rows) < 0.05] = 0.0
        cpu.add(o, a, rew, d, nx)
        gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d), cp.asarray(nx))
        assert gpu.ready() == cpu.ready() == min(cpu.added(), C)
        if cpu.ready() < B:
            continue
        ic, bc = _samples_agree(cpu, gpu, B, step)
        assert_bitwise(bc.next_obs[:, :D], cpu.bufs.next_obs[ic], what="next_obs is the stored ring")
        td = (rng.standard_normal(B) * rng.pareto(1.0, B)).astype(np.float32)
        cpu.update_priorities(ic, td)
        gpu.update_priorities(cp.asarray(ic), cp.asarray(td))
        step += 1
    _assert_same_state(gpu, cpu, "after 40 steps")
    assert gpu.status() == []
    o, a, rew, d, nx = _rows_next(rng, E, D)  # a non-finite next_obs only the device sees
    nx[0, 0] = np.nan
    cpu_before = cpu.state_dict()
    ref.insert(cpu.spec, cpu.bufs, o, a, rew, d, nx)
    gpu.add(cp.asarray(o), cp.asarray(a), cp.asarray(rew), cp.asarray(d), cp.asarray(nx))
    assert cpu.state_dict()["added"] == cpu_before["added"]
    _assert_same_state(gpu, cpu, "after a batch with NaN next_obs")
    assert gpu.status() == ["bad rows rejected"]


@pytest.mark.gpu
def test_gpu_store_next_obs_graphed_equals_eager_bitwise(cp, rng):
    from cudarl.graph import StepGraph

    B, E, D = 96, 8, 16
    o, a, rew, d, nx = (cp.asarray(x) for x in _rows_next(rng, 2400, D))
    step_rows = [cp.asarray(x) for x in _rows_next(rng, E, D)]
    td = cp.asarray(rng.standard_normal(B).astype(np.float32))
    bufs = []
    for _ in range(2):
        r = PrioritizedReplay(3000, D, n_step=1, n_envs=E, seed=4, store_next_obs=True, backend="cupy")
        r.add(o, a, rew, d, nx)
        r.reserve(B)
        bufs.append(r)
    cp.cuda.Device().synchronize()

    def step(buf):
        def fn():
            buf.add(*step_rows)  # a capture-safe add: CuPy rows, ready at once in this mode
            _graph_step(buf, B, td)()

        return fn

    eager = StepGraph("replay_next_eager_twin", [("per", step(bufs[0]))], xp=cp)
    graphed = StepGraph("replay_next_graphed", [("per", step(bufs[1]))], xp=cp)
    _replays_equal_eager_runs(eager, graphed, bufs, B)
    assert int(bufs[1]._scalars.get("added")) == 2400 + 5 * E
    for name in ("tree", "obs", "next_obs", "action", "reward", "discount"):
        assert_bitwise(getattr(bufs[1].bufs, name), getattr(bufs[0].bufs, name), what=name)
    assert_bitwise(bufs[1]._scalars.buffer, bufs[0]._scalars.buffer, what="counters")


def test_device_rules_on_numpy_skip_nan_td_instead_of_raising():
    import numpy as np

    from cudarl.replay import PrioritizedReplay

    r = PrioritizedReplay(64, 3, n_step=1, backend="numpy")
    r.add(np.ones((10, 3), np.float32), np.zeros(10, np.int32), np.ones(10, np.float32), np.full(10, 0.9, np.float32))
    before = r.priorities().copy()
    idx = np.array([2, 3], np.int32)
    td = np.array([np.nan, 5.0], np.float32)
    with pytest.raises(ValueError, match="td: contains NaN"):
        r.update_priorities(idx, td)
    np.testing.assert_array_equal(r.priorities(), before)
    r.update_priorities(idx, td, device_rules=True)
    after = r.priorities()
    assert after[2] == before[2] and after[3] != before[3]
    assert r.status(), "the skipped NaN must be reported in the status bits"


# --- sample with windows: search, gather and the observation windows in one launch -----------------
def _state_rows(rng, n, t_n):
    """Valid state rows [n, 4] (bar in [0, t_n), mirror 0/1, position, hold fraction): bars near 0
    too, so windows reach before the first bar."""
    rows = np.zeros((n, 4), np.float32)
    rows[:, 0] = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), rng.integers(0, t_n, n))
    rows[:, 1] = rng.random(n) < 0.5
    rows[:, 2] = rng.choice(np.array([-1, 0, 1], np.float32), n)
    rows[:, 3] = rng.random(n).astype(np.float32)
    return rows


def _windowed(xp, backend, rng_seed, C, n, E, store_next, t_n, f_n, window, add_rows):
    """A replay of state rows (numpy or cupy), the Windows of a random feature matrix, filled alike."""
    from cudarl.window import Windows

    rng = np.random.default_rng(rng_seed)
    feats = rng.standard_normal((t_n, f_n)).astype(np.float32)
    sign = np.where(rng.random(f_n) < 0.5, -1, 1).astype(np.float32)
    r = PrioritizedReplay(C, 4, n_step=n, n_envs=E, store_next_obs=store_next, seed=17, backend=backend)
    rows = _state_rows(rng, add_rows, t_n)
    _, a, rew, d = _rows(rng, add_rows, 4)
    nxt = _state_rows(rng, add_rows, t_n) if store_next else None
    step = C - C % E  # at most C rows an add: more than C wraps the ring over several adds
    for lo in range(0, add_rows, step):
        sl = slice(lo, lo + step)
        kw = {"next_obs": xp.asarray(nxt[sl])} if store_next else {}
        r.add(xp.asarray(rows[sl]), xp.asarray(a[sl]), xp.asarray(rew[sl]), xp.asarray(d[sl]), **kw)
    return r, Windows(xp.asarray(feats), xp.asarray(sign), window, xp)


def test_sample_with_windows_writes_what_sample_then_windows_gather_would(rng):
    """CPU: the twin's fused op is the unfused sequence (sample with out, then windows.gather of s and s')."""
    B = 9
    (one, win1), (two, win2) = (_windowed(np, "numpy", 5, 300, 3, 4, False, 50, 3, 4, 200) for _ in range(2))
    for _ in range(3):
        b1, b2 = (Batch(np.zeros((B, 4), np.float32), np.zeros((B, 4), np.float32), *_gather_scalars(np, B))
                  for _ in range(2))  # fmt: skip
        pair1, pair2 = np.full((2 * B, win1.width), np.nan, np.float32), np.zeros((2 * B, win2.width), np.float32)
        i1, w1 = one.sample(B, out=b1, windows=win1, windows_out=pair1)
        i2, w2 = two.sample(B, out=b2)
        win2.gather(np.concatenate([b2.obs, b2.next_obs]), pair2)
        assert_bitwise(i1, i2)
        assert_bitwise(w1, w2)
        for x, y in zip(b1, b2, strict=True):
            assert_bitwise(x, y)
        assert_bitwise(pair1, pair2)


@pytest.mark.parametrize("store_next", [False, True])
def test_fused_sample_launchers_pass_their_kernels_c_parameters(monkeypatch, store_next):
    """CPU: the arguments cudarl.ops.replay's fused search-and-gather launchers build (recorded, not
    launched) are, in order, what cuda_src/replay.cu declares: a NumPy array of the declared dtype for
    each pointer, a scalar for each value (kernels.launch checks the same on the GPU)."""
    from cudarl.ops import replay as ops
    from cudarl.testing import assert_launch_args

    launched = []
    monkeypatch.setattr(ops, "launch", lambda family, op, grid, block, args: launched.append((op, args)))
    r, win = _windowed(np, "numpy", 5, 300, 1 if store_next else 3, 4, store_next, 50, 3, 4, 200)
    B = 9
    outs = (np.zeros(B, np.int32), np.zeros(B, np.int64), np.zeros((B, 4), np.float32), np.zeros((B, 4), np.float32),
            *_gather_scalars(np, B))  # fmt: skip
    pair = np.zeros((2, B, win.width), np.float32)
    ops.sample_search_gather(r.spec, r.bufs, *outs)
    ops.sample_search_gather_windows(r.spec, r.bufs, *outs, win.features, win.sign, win.window, *pair)
    assert [op for op, _ in launched] == ["sample_search_gather", "sample_search_gather_windows"]
    for op, args in launched:
        assert_launch_args("replay", op, args)


def _gather_scalars(xp, B):
    return xp.zeros(B, np.int32), xp.zeros(B, np.float32), xp.zeros(B, np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "C, n, E, store_next, t_n, f_n, window, B, add_rows",
    [
        (50, 1, 1, False, 20, 1, 1, 1, 30),  # one sample, a 3-float window
        (1000, 3, 4, False, 500, 7, 3, 33, 600),  # odd batch, windows reaching before bar 0
        (1000, 1, 4, True, 500, 64, 1, 512, 1000),  # the reference: 66-float windows, stored next rows
        (1000, 1, 4, True, 500, 7, 64, 100, 1000),  # stored next rows (counterfactual runs), 64-bar windows
        ((1 << 16) + 3, 3, 64, False, 4000, 30, 40, 100, 20_000),  # a 1280-float window
        (50, 3, 2, False, 200, 5, 2, 40, 130),  # a wrapped ring: n-step rows past slot C - 1 wrap to 0
    ],
)
def test_gpu_sample_with_windows_equals_the_twin_and_the_unfused_launches(
    cp, C, n, E, store_next, t_n, f_n, window, B, add_rows
):
    """sample(out=, windows=) on the GPU (one launch) against the twin and against sample(out=) then
    windows.gather on the GPU: indices, rows, targets and both windows bit for bit, weights to 1e-6."""
    add_rows -= add_rows % E
    args = (C, n, E, store_next, t_n, f_n, window, add_rows)
    (cpu, win_c), (fused, win_f), (split, win_s) = (
        _windowed(xp, be, 23, *args) for xp, be in ((np, "numpy"), (cp, "cupy"), (cp, "cupy"))
    )
    mirrored = 0
    for step in range(6):
        out_c = Batch(np.zeros((B, 4), np.float32), np.zeros((B, 4), np.float32), *_gather_scalars(np, B))
        out_f = Batch(cp.full((B, 4), np.nan, np.float32), cp.full((B, 4), np.nan, np.float32), *_gather_scalars(cp, B))
        out_s = Batch(cp.zeros((B, 4), np.float32), cp.zeros((B, 4), np.float32), *_gather_scalars(cp, B))
        pair_c = np.zeros((2 * B, win_c.width), np.float32)
        pair_f = cp.full((2 * B, win_f.width), np.nan, np.float32)
        pair_s = cp.zeros((2 * B, win_s.width), np.float32)
        ic, wc = cpu.sample(B, out=out_c, windows=win_c, windows_out=pair_c)
        i_f, w_f = fused.sample(B, out=out_f, windows=win_f, windows_out=pair_f)
        i_s, w_s = split.sample(B, out=out_s)
        win_s.gather(cp.concatenate([out_s.obs, out_s.next_obs]), pair_s)
        assert_bitwise(i_f, ic, what=f"indices at step {step}")
        assert_bitwise(i_f, i_s, what=f"indices at step {step} (unfused)")
        assert_parity(w_f, wc, rtol=1e-6, what=f"weights at step {step}")
        for name, x, y, z in zip(Batch._fields, out_f, out_c, out_s, strict=True):
            assert_bitwise(x, y, what=f"{name} at step {step}")
            assert_bitwise(x, z, what=f"{name} at step {step} (unfused)")
        assert_bitwise(pair_f, pair_c, what=f"windows at step {step}")
        assert_bitwise(pair_f, pair_s, what=f"windows at step {step} (unfused)")
        mirrored += int((out_c.obs[:, 1] == 1).sum())
    assert mirrored > 0 or B == 1  # mirror rows among the samples: the sign flip ran


@pytest.mark.gpu
def test_gpu_sample_with_windows_graphed_equals_eager(cp):
    """The fused sample captured once and replayed equals eager launches bit for bit (the step counter,
    and so the draws, advance in device memory)."""
    from cudarl.graph import StepGraph

    B = 64
    (eager, win_e), (graphed, win_g) = (_windowed(cp, "cupy", 29, 2000, 3, 4, False, 300, 5, 4, 1200) for _ in range(2))
    outs = []
    for r, win in ((eager, win_e), (graphed, win_g)):
        r.reserve(B)
        out = Batch(cp.zeros((B, 4), np.float32), cp.zeros((B, 4), np.float32), *_gather_scalars(cp, B))
        pair = cp.zeros((2 * B, win.width), np.float32)
        outs.append(
            (out, pair, lambda r=r, out=out, win=win, pair=pair: r.sample(B, out=out, windows=win, windows_out=pair))
        )
    cp.cuda.Device().synchronize()
    g = StepGraph("replay_windows_graphed", [("sample", outs[1][2])], xp=cp)
    g.capture()
    for k in range(5):
        outs[0][2]()
        g.replay()
        g.synchronize()
        cp.cuda.Device().synchronize()
        for x, y in zip((*outs[1][0], outs[1][1]), (*outs[0][0], outs[0][1]), strict=True):
            assert_bitwise(x, y, what=f"step {k}")
        idx_g, idx_e = graphed._batches[B][0], eager._batches[B][0]
        assert_bitwise(idx_g, idx_e, what=f"indices at step {k}")
