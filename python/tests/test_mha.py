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
