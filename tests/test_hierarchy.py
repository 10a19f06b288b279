"""Tests of skfedgp._hierarchy: flat-vector packing of the global and local
parameter blocks and the client/server objectives of Algorithm 1 (SPEC
section 1, "Federated training"), checked by central finite differences on
the flat *unconstrained* vectors."""

import numpy as np
import pytest

from skfedgp._hierarchy import (
    NOISE_FLOOR,
    Packer,
    client_objective,
    global_spec,
    local_spec,
    predict_client,
    server_objective,
)
from skfedgp._linalg import softplus

N, D, M, ML = 20, 2, 4, 3

COMPONENT_SETS = [
    ("global", "deviation", "local"),
    ("global",),
    ("local",),
    ("global", "local"),
    ("deviation", "local"),
]


def _chol(rng, m):
    C = np.tril(rng.normal(scale=0.2, size=(m, m)), -1)
    C[np.diag_indices(m)] = rng.uniform(0.4, 1.0, size=m)
    return C


def _values(rng):
    """Constrained values for every name a spec may contain."""
    return {
        "Z_g": rng.uniform(0.0, 3.0, size=(M, D)),
        "lengthscale_g": np.array([1.2, 0.9]),
        "variance_g": 1.1,
        "phi": 0.6,
        "m_g": rng.normal(size=M),
        "C_g": _chol(rng, M),
        "m_d": rng.normal(scale=0.5, size=M),
        "C_d": _chol(rng, M),
        "m_u": rng.normal(scale=0.5, size=ML),
        "C_u": _chol(rng, ML),
        "Z_l": rng.uniform(0.0, 3.0, size=(ML, D)),
        "lengthscale_l": np.array([0.6, 0.7]),
        "variance_l": 0.5,
        "noise_variance": 0.2,
    }


def _data(rng):
    X = rng.uniform(0.0, 3.0, size=(N, D))
    y = np.cos(1.5 * X[:, 0]) + 0.4 * X[:, 1] + 0.1 * rng.normal(size=N)
    return X, y


def _setup(components, seed=5):
    rng = np.random.default_rng(seed)
    X, y = _data(rng)
    vals = _values(rng)
    gpack = global_spec(components, M, D)
    lpack = local_spec(components, M, ML, D)
    theta_g = gpack.pack({k: vals[k] for k in gpack.names()})
    theta_l = lpack.pack({k: vals[k] for k in lpack.names()})
    return X, y, gpack, lpack, theta_g, theta_l


# ----------------------------------------------------------------- Packer

def _mixed_packer():
    return Packer([
        ("a", (3, 2), "free"),
        ("b", (2,), "positive"),
        ("s", (), "positive"),
        ("noise", (), "noise"),
        ("C", (4, 4), "tril"),
    ])


def test_packer_layout_and_round_trip(rng):
    pk = _mixed_packer()
    assert pk.size == 6 + 2 + 1 + 1 + 10
    assert pk.names() == ["a", "b", "s", "noise", "C"]
    # slices tile the vector exactly once
    covered = np.zeros(pk.size, int)
    for sl in pk.slices.values():
        covered[sl] += 1
    assert np.all(covered == 1)

    theta = rng.normal(size=pk.size)
    vals = pk.unpack(theta)
    assert isinstance(vals["s"], float) and isinstance(vals["noise"], float)
    assert vals["a"].shape == (3, 2) and vals["C"].shape == (4, 4)
    assert np.all(vals["b"] > 0) and vals["s"] > 0 and vals["noise"] > NOISE_FLOOR
    assert vals["noise"] == pytest.approx(softplus(theta[pk.slices["noise"]])[0] + NOISE_FLOOR)
    C = vals["C"]
    assert np.array_equal(C, np.tril(C)) and np.all(np.diag(C) > 0)
    np.testing.assert_allclose(pk.pack(vals), theta, rtol=1e-10, atol=1e-12)
    vals2 = pk.unpack(pk.pack(vals))
    for k in vals:
        np.testing.assert_allclose(vals2[k], vals[k], rtol=1e-12)


def test_packer_pack_rejects_bad_values():
    pk = _mixed_packer()
    good = pk.unpack(np.zeros(pk.size))
    with pytest.raises(ValueError, match="'a'"):
        pk.pack(dict(good, a=np.zeros((2, 3))))
    with pytest.raises(ValueError, match="positive"):
        pk.pack(dict(good, s=-1.0))
    with pytest.raises(ValueError, match="noise"):
        pk.pack(dict(good, noise=NOISE_FLOOR / 2))


def test_packer_flat_grad_chain_rule(rng, numgrad, assert_grad_close):
    """flat_grad maps constrained gradients to unconstrained ones."""
    pk = _mixed_packer()
    theta = rng.normal(size=pk.size)
    A = {name: rng.normal(size=shape) for name, shape, _ in pk.spec}

    def F(t):
        v = pk.unpack(t)
        # non-linear in the constrained values: dF/dv = A + v
        return float(sum(np.sum(A[k] * v[k]) + 0.5 * np.sum(np.asarray(v[k]) ** 2) for k in v))

    vals = pk.unpack(theta)
    # the upper triangle of C is structurally zero: its entries of A do not
    # matter, and flat_grad must ignore them
    grads = {k: A[k] + np.asarray(vals[k]) for k in vals}
    g = pk.flat_grad(theta, grads)
    num = numgrad(F, theta)
    for name in pk.names():
        sl = pk.slices[name]
        assert_grad_close(g[sl], num[sl], f"flat_grad {name}")
    # missing names count as zero
    g_partial = pk.flat_grad(theta, {"a": grads["a"]})
    assert np.array_equal(g_partial[pk.slices["a"]], g[pk.slices["a"]])
    assert not np.any(np.delete(g_partial, np.arange(pk.size)[pk.slices["a"]]))


# ----------------------------------------------------------- objectives

@pytest.mark.parametrize("components", COMPONENT_SETS, ids="+".join)
def test_client_objective_gradients(components, numgrad, assert_grad_close):
    X, y, gpack, lpack, theta_g, theta_l = _setup(components)
    value, g_loc, g_glob = client_objective(theta_g, theta_l, X, y, gpack, lpack, components)
    assert np.isfinite(value)
    assert g_loc.shape == (lpack.size,) and g_glob.shape == (gpack.size,)

    def f_loc(t):
        return client_objective(theta_g, t, X, y, gpack, lpack, components,
                                need_global_grad=False)[0]

    def f_glob(t):
        return client_objective(t, theta_l, X, y, gpack, lpack, components,
                                need_global_grad=False)[0]

    num_l = numgrad(f_loc, theta_l)
    for name in lpack.names():
        sl = lpack.slices[name]
        assert_grad_close(g_loc[sl], num_l[sl], f"{components} local {name}")
    if gpack.size:
        num_g = numgrad(f_glob, theta_g)
        for name in gpack.names():
            sl = gpack.slices[name]
            assert_grad_close(g_glob[sl], num_g[sl], f"{components} global {name}")
    else:
        assert components == ("local",)


@pytest.mark.parametrize("components", COMPONENT_SETS, ids="+".join)
def test_client_objective_value_is_expected_loglik_minus_client_kls(components):
    """value = E_i - KL(q(w_i)) - KL(q(v_i)); the global KL is the server's."""
    from skfedgp._hierarchy import build_blocks
    from skfedgp._sparse import client_term, kl_whitened

    X, y, gpack, lpack, theta_g, theta_l = _setup(components)
    value, _, _ = client_objective(theta_g, theta_l, X, y, gpack, lpack, components)
    G, B = gpack.unpack(theta_g), lpack.unpack(theta_l)
    E = client_term(X, y, build_blocks(G, B, components), B["noise_variance"],
                    need_grad=False)[0]
    kl = 0.0
    if "deviation" in components:
        kl += kl_whitened(B["m_d"], B["C_d"])[0]
    if "local" in components:
        kl += kl_whitened(B["m_u"], B["C_u"])[0]
    assert value == pytest.approx(E - kl, rel=1e-13)
    if "global" in components:
        assert kl_whitened(G["m_g"], G["C_g"])[0] > 0  # present but not subtracted here


def test_server_objective_gradient(numgrad, assert_grad_close):
    components = ("global", "deviation", "local")
    _, _, gpack, _, theta_g, _ = _setup(components)
    value, grad = server_objective(theta_g, gpack)
    G = gpack.unpack(theta_g)
    from skfedgp._sparse import kl_whitened

    assert value == pytest.approx(-kl_whitened(G["m_g"], G["C_g"])[0], rel=1e-14)
    num = numgrad(lambda t: server_objective(t, gpack)[0], theta_g)
    for name in ("m_g", "C_g"):
        sl = gpack.slices[name]
        assert_grad_close(grad[sl], num[sl], f"server {name}")
    # the KL does not depend on the kernel, phi or Z_g
    for name in ("Z_g", "lengthscale_g", "variance_g", "phi"):
        assert not np.any(grad[gpack.slices[name]])
        assert np.max(np.abs(num[gpack.slices[name]])) < 1e-8
    # no global component: nothing on the server side
    gp = global_spec(("deviation", "local"), M, D)
    v, g = server_objective(np.zeros(gp.size), gp)
    assert v == 0.0 and g.shape == (gp.size,) and not np.any(g)


def test_predict_client_sums_components():
    components = ("global", "deviation", "local")
    X, y, gpack, lpack, theta_g, theta_l = _setup(components)
    G, B = gpack.unpack(theta_g), lpack.unpack(theta_l)
    Xs = np.random.default_rng(3).uniform(0.0, 3.0, size=(6, D))
    mean, var = predict_client(Xs, G, B, components)
    parts = predict_client(Xs, G, B, components, per_component=True)
    assert set(parts) == {"global", "deviation", "local"}
    # means add exactly; variances add too (independent components, and the
    # residual (1 + phi)(K - W W^T) splits as 1 and phi)
    np.testing.assert_allclose(sum(p[0] for p in parts.values()), mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sum(p[1] for p in parts.values()), var, rtol=1e-12)
    mean_f, cov = predict_client(Xs, G, B, components, full_cov=True)
    np.testing.assert_allclose(np.diag(cov), var, rtol=1e-10)


def test_closed_form_global_factor_is_stationary():
    """The closed-form q(v_g) from summed client statistics maximises the
    federated ELBO in (m_g, C_g): the summed gradient vanishes there
    (SPEC section 1, "Beyond the paper")."""
    from skfedgp._hierarchy import global_statistics, optimal_global_factor

    components = ("global", "deviation", "local")
    gpack = global_spec(components, M, D)
    lpack = local_spec(components, M, ML, D)
    rng = np.random.default_rng(8)
    G0 = _values(rng)
    theta_g = gpack.pack({k: G0[k] for k in gpack.names()})
    clients = []
    for seed in (1, 2):
        r = np.random.default_rng(seed)
        X, y = _data(r)
        v = _values(r)
        clients.append((X, y, lpack.pack({k: v[k] for k in lpack.names()})))
    stats = [global_statistics(theta_g, tl, X, y, gpack, lpack, components)
             for X, y, tl in clients]
    assert all(P.shape == (M, M) and s.shape == (M,) for P, s in stats)
    m_g, C_g = optimal_global_factor(sum(P for P, _ in stats), sum(s for _, s in stats))
    G = gpack.unpack(theta_g)
    G.update(m_g=m_g, C_g=C_g)
    theta_opt = gpack.pack(G)
    total = server_objective(theta_opt, gpack)[1]
    for X, y, tl in clients:
        total = total + client_objective(theta_opt, tl, X, y, gpack, lpack, components)[2]
    for name in ("m_g", "C_g"):
        assert np.max(np.abs(total[gpack.slices[name]])) < 1e-8, name
    # and it is a maximum: moving m_g lowers the summed objective
    def total_value(t):
        return server_objective(t, gpack)[0] + sum(
            client_objective(t, tl, X, y, gpack, lpack, components, need_global_grad=False)[0]
            for X, y, tl in clients)
    bumped = theta_opt.copy()
    bumped[gpack.slices["m_g"]] += 0.05
    assert total_value(bumped) < total_value(theta_opt)


@pytest.mark.parametrize("components", [("global", "deviation", "local"),
                                        ("deviation", "local"), ("local",)])
def test_closed_form_local_factors_are_stationary(components):
    """Coordinate ascent on q(w_i), q(v_i) converges to a stationary point of
    the client objective in the client's own factors, and never lowers it."""
    from skfedgp._hierarchy import optimal_local_factors

    X, y, gpack, lpack, theta_g, theta_l = _setup(components, seed=11)

    def value(t):
        return client_objective(theta_g, t, X, y, gpack, lpack, components,
                                need_global_grad=False)[0]

    one = optimal_local_factors(theta_g, theta_l, X, y, gpack, lpack, components, sweeps=1)
    assert value(one) >= value(theta_l) - 1e-10
    many = optimal_local_factors(theta_g, theta_l, X, y, gpack, lpack, components, sweeps=300)
    assert value(many) >= value(one) - 1e-10
    grad = client_objective(theta_g, many, X, y, gpack, lpack, components,
                            need_global_grad=False)[1]
    for name in ("m_d", "C_d", "m_u", "C_u"):
        if name in lpack.slices:
            assert np.max(np.abs(grad[lpack.slices[name]])) < 1e-6, name
    # the hyperparameters are left untouched
    for name in ("Z_l", "lengthscale_l", "variance_l", "noise_variance"):
        if name in lpack.slices:
            np.testing.assert_array_equal(many[lpack.slices[name]], theta_l[lpack.slices[name]])


def test_closed_form_statistics_stream_in_chunks(monkeypatch):
    """The streamed Gram matrices do not depend on the chunk size."""
    import skfedgp._hierarchy as hier

    components = ("global", "deviation", "local")
    X, y, gpack, lpack, theta_g, theta_l = _setup(components, seed=12)
    full = hier.global_statistics(theta_g, theta_l, X, y, gpack, lpack, components)
    monkeypatch.setattr(hier, "STAT_CHUNK_ROWS", 3)
    chunked = hier.global_statistics(theta_g, theta_l, X, y, gpack, lpack, components)
    for a, b in zip(full, chunked):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
