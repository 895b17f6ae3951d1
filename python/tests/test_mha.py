"""simdattn.MultiheadAttention against PyTorch 1.13's nn.MultiheadAttention
with the same weights (self- and cross-attention, kdim/vdim, bias on/off,
add_bias_kv, key_padding_mask, bool and float attn_mask, causal, weights
averaged and per head, batch_first both ways), and GQA against a torch
composition of the same projections."""

import numpy as np
import pytest
import torch

import simdattn

torch.manual_seed(0)
TOL = 1e-4  # f32 end to end: projections, fused attention, output

from conftest import target  # noqa: F401,E402  (every available target)


def torch_layer(e, h, *, kdim=None, vdim=None, bias=True, add_bias_kv=False, batch_first=True):
    m = torch.nn.MultiheadAttention(e, h, bias=bias, add_bias_kv=add_bias_kv, kdim=kdim,
                                    vdim=vdim, batch_first=batch_first)
    m.eval()
    with torch.no_grad():
        for p in m.parameters():  # non-zero biases, so that they count
            p.uniform_(-0.5, 0.5)
    return m


def ours_from(m, e, h, **kw):
    layer = simdattn.MultiheadAttention(e, h, **kw)
    return layer.load_state_dict({k: v for k, v in m.state_dict().items()})


def close(a, b, tol=TOL):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    assert a.shape == b.shape, (a.shape, b.shape)
    err = np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))
    assert err <= tol, err


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_with_weights(batch_first, bias, target):
    e, h, b, l = 32, 4, 2, 7
    m = torch_layer(e, h, bias=bias, batch_first=batch_first)
    ours = ours_from(m, e, h, bias=bias, batch_first=batch_first, target=target)
    x = torch.randn((b, l, e) if batch_first else (l, b, e))
    for average in (True, False):
        ref, ref_w = m(x, x, x, need_weights=True, average_attn_weights=average)
        out, w = ours(x, need_weights=True, average_attn_weights=average)
        assert isinstance(out, torch.Tensor)
        close(out, ref)
        close(w, ref_w, 1e-5)


def test_numpy_in_numpy_out_and_unbatched():
    e, h = 16, 2
    m = torch_layer(e, h)
    ours = ours_from(m, e, h)
    x = torch.randn(5, e)
    ref, _ = m(x, x, x)
    out, w = ours(x.numpy())
    assert isinstance(out, np.ndarray) and w is None
    close(out, ref)


@pytest.mark.parametrize("add_bias_kv", [False, True])
def test_cross_attention_kdim_vdim(add_bias_kv, target):
    e, h, b, lq, lk = 24, 3, 2, 5, 9
    m = torch_layer(e, h, kdim=12, vdim=20, add_bias_kv=add_bias_kv)
    ours = ours_from(m, e, h, kdim=12, vdim=20, add_bias_kv=add_bias_kv, target=target)
    q, k, v = torch.randn(b, lq, e), torch.randn(b, lk, 12), torch.randn(b, lk, 20)
    ref, ref_w = m(q, k, v, need_weights=True, average_attn_weights=False)
    out, w = ours(q, k, v, need_weights=True, average_attn_weights=False)
    close(out, ref)
    close(w, ref_w, 1e-5)


def test_add_bias_kv_self_attention_with_masks():
    e, h, b, l = 32, 4, 2, 6
    m = torch_layer(e, h, add_bias_kv=True)
    ours = ours_from(m, e, h, add_bias_kv=True)
    x = torch.randn(b, l, e)
    pad = torch.zeros(b, l, dtype=torch.bool)
    pad[0, 2] = pad[1, 5] = True
    ref, ref_w = m(x, x, x, key_padding_mask=pad)
    out, w = ours(x, key_padding_mask=pad, need_weights=True)
    close(out, ref)
    close(w, ref_w, 1e-5)


@pytest.mark.parametrize("kind", ["bool2d", "float2d", "bool3d", "float3d", "padding"])
def test_masks(kind):
    e, h, b, l = 32, 4, 2, 8
    m = torch_layer(e, h)
    ours = ours_from(m, e, h)
    x = torch.randn(b, l, e)
    kw = {}
    shape = (l, l) if kind.endswith("2d") else (b * h, l, l)
    if kind.startswith("bool"):
        mask = torch.rand(shape) < 0.3
        mask[..., 0] = False  # no row fully masked (PyTorch gives NaN there)
        kw["attn_mask"] = mask
    elif kind.startswith("float"):
        kw["attn_mask"] = torch.randn(shape)
    else:
        pad = torch.zeros(b, l, dtype=torch.bool)
        pad[0, 3:] = True
        kw["key_padding_mask"] = pad
        kw["attn_mask"] = torch.randn(l, l)
    ref, ref_w = m(x, x, x, **kw)
    out, w = ours(x, need_weights=True, **kw)
    close(out, ref)
    close(w, ref_w, 1e-5)


def test_is_causal_matches_torch_with_a_causal_mask():
    e, h, b, l = 32, 4, 2, 9
    m = torch_layer(e, h, batch_first=False)
    ours = ours_from(m, e, h, batch_first=False)
    x = torch.randn(l, b, e)
    causal = torch.triu(torch.ones(l, l, dtype=torch.bool), diagonal=1)
    ref, ref_w = m(x, x, x, attn_mask=causal, average_attn_weights=False)
    out, w = ours(x, is_causal=True, need_weights=True, average_attn_weights=False)
    close(out, ref)
    close(w, ref_w, 1e-5)


@pytest.mark.parametrize("naming", ["llama", "torch"])
def test_gqa_against_a_torch_composition(naming, target):
    e, hq, hkv, d, b, l = 48, 6, 2, 8, 2, 10
    wq, wk, wv = (torch.randn(hq * d, e) * 0.2, torch.randn(hkv * d, e) * 0.2,
                  torch.randn(hkv * d, e) * 0.2)
    wo = torch.randn(e, hq * d) * 0.2
    x = torch.randn(b, l, e)
    q = (x @ wq.T).view(b, l, hq, d).transpose(1, 2)
    k = (x @ wk.T).view(b, l, hkv, d).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    v = (x @ wv.T).view(b, l, hkv, d).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = q @ k.transpose(-1, -2) / d ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(l, l, dtype=torch.bool), 1), float("-inf"))
    ref = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, l, hq * d) @ wo.T
    ours = simdattn.MultiheadAttention(e, hq, num_kv_heads=hkv, head_dim=d, bias=False,
                                       target=target)
    if naming == "llama":
        sd = {"model.layers.0.self_attn.q_proj.weight": wq, "model.layers.0.self_attn.k_proj.weight": wk,
              "model.layers.0.self_attn.v_proj.weight": wv, "model.layers.0.self_attn.o_proj.weight": wo}
    else:
        sd = {"in_proj_weight": torch.cat([wq, wk, wv]), "out_proj.weight": wo}
    ours.load_state_dict(sd)
    out, _ = ours(x, is_causal=True)
    close(out, ref)


def test_errors_name_the_argument():
    ours = simdattn.MultiheadAttention(16, 2)
    with pytest.raises(ValueError, match="missing tensor"):
        ours.load_state_dict({"in_proj_weight": np.zeros((48, 16), np.float32)})
    with pytest.raises(ValueError, match="num_kv_heads"):
        simdattn.MultiheadAttention(16, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="not loaded"):
        ours(np.zeros((1, 3, 16), np.float32))


def _cli():
    """The simdattn tool of this build tree (build/python/simdattn -> build/simdattn)."""
    import os
    path = os.environ.get("SIMDATTN_CLI") or os.path.join(
        os.path.dirname(simdattn.__file__), "..", "..", "simdattn")
    return path if os.path.exists(path) else None


@pytest.mark.skipif(_cli() is None, reason="no simdattn tool next to the package")
@pytest.mark.parametrize("compressed", [False, True])
def test_cli_mha_matches_torch(tmp_path, compressed):
    import subprocess
    e, h, kd = 32, 4, 12
    m = torch_layer(e, h, kdim=kd, vdim=kd)
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    (np.savez_compressed if compressed else np.savez)(tmp_path / "w.npz", **sd)
    x, y = torch.randn(2, 5, e), torch.randn(2, 7, kd)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    r = subprocess.run([_cli(), "mha", "--weights", str(tmp_path / "w.npz"), "--x",
                        str(tmp_path / "x.npy"), "--kv-source", str(tmp_path / "y.npy"),
                        "--heads", str(h), "--out", str(tmp_path / "o.npy")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    close(np.load(tmp_path / "o.npy"), m(x, y, y)[0])
    r = subprocess.run([_cli(), "mha", "--weights", str(tmp_path / "w.npz"), "--x",
                        str(tmp_path / "x.npy"), "--heads", str(h), "--out",
                        str(tmp_path / "o.npy")], capture_output=True, text=True)
    assert r.returncode == 2 and "key.dim" in r.stderr


@pytest.mark.parametrize("dtype,tol", [("bf16", 5e-2), ("f16", 5e-3)])
def test_sixteen_bit_storage_inside_the_layer(dtype, tol):
    e, h, b, l = 32, 4, 2, 7
    m = torch_layer(e, h)
    ours = ours_from(m, e, h, dtype=dtype)
    x = torch.randn(b, l, e)
    close(ours(x)[0], m(x, x, x)[0], tol)


def rope_ref(x, positions, rotary_dim, theta, interleaved):
    """x [B, L, H, D] (float64) rotated at positions (Llama's RoPE)."""
    half = rotary_dim // 2
    inv = theta ** (-2.0 * np.arange(half) / rotary_dim)
    ang = positions[:, None] * inv[None, :]  # [L, half]
    c, s = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    y = x.copy()
    i0 = np.arange(half) * 2 if interleaved else np.arange(half)
    i1 = i0 + 1 if interleaved else i0 + half
    a, b = x[..., i0], x[..., i1]
    y[..., i0] = a * c - b * s
    y[..., i1] = b * c + a * s
    return y


def llama_ref(w, x, hq, hkv, d, rotary_dim, theta, interleaved):
    """The whole sequence x [B, L, E] through a Llama layer with RoPE and a
    causal mask, in float64."""
    x = x.astype(np.float64)
    b, l, _ = x.shape
    q = (x @ w["q_proj.weight"].T.astype(np.float64)).reshape(b, l, hq, d)
    k = (x @ w["k_proj.weight"].T.astype(np.float64)).reshape(b, l, hkv, d)
    v = (x @ w["v_proj.weight"].T.astype(np.float64)).reshape(b, l, hkv, d)
    pos = np.arange(l, dtype=np.float64)
    q = rope_ref(q, pos, rotary_dim, theta, interleaved)
    k = rope_ref(k, pos, rotary_dim, theta, interleaved)
    k, v = np.repeat(k, hq // hkv, axis=2), np.repeat(v, hq // hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(d)
    s = np.where(np.tril(np.ones((l, l), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p, v).reshape(b, l, hq * d)
    return o @ w["o_proj.weight"].T.astype(np.float64)


@pytest.mark.parametrize("layout,interleaved", [("nhd", False), ("hnd", True)])
def test_step_paged_with_rope_equals_the_whole_sequence(target, layout, interleaved):
    e, hq, hkv, d, b, l, block = 32, 4, 2, 8, 2, 11, 8
    rng = np.random.default_rng(5)
    w = {"q_proj.weight": rng.uniform(-0.3, 0.3, (hq * d, e)).astype(np.float32),
         "k_proj.weight": rng.uniform(-0.3, 0.3, (hkv * d, e)).astype(np.float32),
         "v_proj.weight": rng.uniform(-0.3, 0.3, (hkv * d, e)).astype(np.float32),
         "o_proj.weight": rng.uniform(-0.3, 0.3, (e, hq * d)).astype(np.float32)}
    layer = simdattn.MultiheadAttention(e, hq, num_kv_heads=hkv, bias=False, target=target)
    layer.load_state_dict(w)
    x = rng.uniform(-1, 1, (b, l, e)).astype(np.float32)
    shape = (5, block, hkv, d) if layout == "nhd" else (5, hkv, block, d)
    k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    block_table = np.array([[3, 0], [4, 1]], dtype=np.int32)
    seq_lens = np.zeros(b, dtype=np.int32)
    outs = []
    for t0, t in [(0, 5)] + [(i, 1) for i in range(5, l)]:  # prefill, then tokens
        outs.append(layer.step_paged(x[:, t0:t0 + t], k_cache, v_cache, block_table, seq_lens,
                                     layout=layout, rotary_dim=4, interleaved=interleaved,
                                     rope_theta=500.0))
        assert list(seq_lens) == [t0 + t] * b
    close(np.concatenate(outs, axis=1), llama_ref(w, x, hq, hkv, d, 4, 500.0, interleaved))


def test_step_paged_errors():
    layer = simdattn.MultiheadAttention(32, 4, bias=False)
    rng = np.random.default_rng(6)
    layer.load_state_dict({n: rng.uniform(-0.3, 0.3, (32, 32)).astype(np.float32)
                           for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight",
                                     "o_proj.weight")})
    x = np.zeros((1, 1, 32), np.float32)
    cache = np.zeros((2, 8, 4, 8), np.float32)
    table = np.array([[0, 1]], dtype=np.int32)
    with pytest.raises(ValueError, match="seq_lens"):
        layer.step_paged(x, cache, cache.copy(), table, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="rotary_dim"):
        layer.step_paged(x, cache, cache.copy(), table, np.zeros(1, np.int32), rope_theta=1e4,
                         rotary_dim=3)
    with pytest.raises(ValueError, match="seq_lens"):
        layer.step_paged(x, cache, cache.copy(), table, np.array([16], np.int32))
