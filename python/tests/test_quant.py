"""Quantized KV caches from Python: simdattn.quantize_kv, then attention()
and paged_attention() on the quantized arrays with their format names,
held to the float64 reference on the dequantized values (an independent
NumPy decoding of each format)."""

import numpy as np
import pytest
import torch

import simdattn
from conftest import reference

FORMATS = ["int8", "q8_0", "fp8_e4m3", "fp8_e5m2"]


def fp8_table(fmt):
    """The 256 fp8 codes' values (OCP e4m3 / e5m2), in float64."""
    man, bias = (3, 7) if fmt == "fp8_e4m3" else (2, 15)
    out = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code & 0x7F) >> man, code & ((1 << man) - 1)
        if fmt == "fp8_e4m3" and (code & 0x7F) == 0x7F:
            out[code] = np.nan
        elif fmt == "fp8_e5m2" and e == 31:
            out[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            out[code] = sign * m * 2.0 ** (1 - bias - man)
        else:
            out[code] = sign * (1 + m / 2 ** man) * 2.0 ** (e - bias)
    return out


def dequantize(data, scales, fmt):
    """The float64 values of quantize_kv's output."""
    data = np.asarray(data)
    if fmt == "int8":
        return data.view(np.int8).astype(np.float64) * np.asarray(scales, np.float64)[..., None]
    if fmt == "q8_0":
        blocks = data.reshape(data.shape[:-1] + (-1, 34))
        d = blocks[..., :2].copy().view(np.float16).astype(np.float64)
        q = blocks[..., 2:].view(np.int8).astype(np.float64)
        return (q * d).reshape(data.shape[:-1] + (-1,))
    return fp8_table(fmt)[data] * scales


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_kv_rounds_to_nearest(fmt):
    rng = np.random.default_rng(1)
    x = rng.uniform(-3, 3, (2, 3, 5, 64)).astype(np.float32)
    data, scales = simdattn.quantize_kv(x, fmt)
    assert data.dtype == np.uint8
    assert data.shape == x.shape[:-1] + ((64 // 32 * 34,) if fmt == "q8_0" else (64,))
    y = dequantize(data, scales, fmt)
    if fmt == "int8":
        assert scales.shape == x.shape[:-1]
        np.testing.assert_array_equal(scales, np.abs(x).max(-1) / np.float32(127))
        assert np.all(np.abs(y - x) <= scales[..., None] / 2 * (1 + 1e-6))
    elif fmt == "q8_0":
        assert scales is None
        assert np.max(np.abs(y - x)) <= 3 / 127 * 0.51 + 1e-3
    else:
        assert scales == pytest.approx(float(np.abs(x).max()) / (448 if fmt == "fp8_e4m3" else 57344))
        rel = 2.0 ** -(4 if fmt == "fp8_e4m3" else 3)
        assert np.all(np.abs(y - x) <= rel * np.abs(x) + 1e-6)


def test_fp8_saturates_and_keeps_nan():
    x = np.array([1000.0, -1e9, np.inf, np.nan, 448.0, 1.0], np.float32)
    data, scale = simdattn.quantize_kv(x, "fp8_e4m3", scale=1.0)
    assert scale == 1.0
    y = fp8_table("fp8_e4m3")[data]
    np.testing.assert_array_equal(y[[0, 1, 2, 4, 5]], [448, -448, 448, 448, 1])
    assert np.isnan(y[3])
    with pytest.raises(ValueError, match="scale"):
        simdattn.quantize_kv(x, "int8", scale=2.0)
    with pytest.raises(ValueError, match="multiple of 32"):
        simdattn.quantize_kv(np.zeros((2, 40), np.float32), "q8_0")


@pytest.mark.parametrize("k_fmt,v_fmt", [("int8", "int8"), ("q8_0", "q8_0"),
                                         ("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", None),
                                         ("int8", None), (None, "q8_0")])
@pytest.mark.parametrize("lq", [1, 37])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_attention_on_quantized_kv(k_fmt, v_fmt, lq, layout, target):
    rng = np.random.default_rng(2)
    b, hq, hkv, lk, d = 1, 8, 2, 300, 64
    shape = (lambda h, s: (b, h, s, d)) if layout == "bhsd" else (lambda h, s: (b, s, h, d))
    q = rng.uniform(-1, 1, shape(hq, lq)).astype(np.float32)
    k = rng.uniform(-1, 1, shape(hkv, lk)).astype(np.float32)
    v = rng.uniform(-1, 1, shape(hkv, lk)).astype(np.float32)
    k_data, k_scale = simdattn.quantize_kv(k, k_fmt) if k_fmt else (k, None)
    v_data, v_scale = simdattn.quantize_kv(v, v_fmt) if v_fmt else (v, None)
    k_ref = dequantize(k_data, k_scale, k_fmt) if k_fmt else k.astype(np.float64)
    v_ref = dequantize(v_data, v_scale, v_fmt) if v_fmt else v.astype(np.float64)
    out = simdattn.attention(q, k_data, v_data, layout=layout, causal=lq > 1,
                             alignment="bottom-right", k_format=k_fmt, v_format=v_fmt,
                             k_scale=k_scale, v_scale=v_scale, target=target)
    to_bhsd = (lambda x: x) if layout == "bhsd" else (lambda x: np.swapaxes(x, 1, 2))
    o_ref, _ = reference(to_bhsd(q), to_bhsd(k_ref), to_bhsd(v_ref), causal=lq > 1,
                         alignment="bottom-right")
    err = np.max(np.abs(to_bhsd(out) - o_ref)) / max(1.0, np.max(np.abs(v_ref)))
    assert err <= 2e-5


def test_torch_tensors_and_paged(target):
    torch.manual_seed(3)
    nb, bs, hkv, hq, d = 6, 16, 2, 4, 32
    k = torch.rand(nb, bs, hkv, d) * 2 - 1
    v = torch.rand(nb, bs, hkv, d) * 2 - 1
    k8, k_scales = simdattn.quantize_kv(k, "int8")
    v8, v_scale = simdattn.quantize_kv(v, "fp8_e4m3")
    assert k8.dtype == torch.uint8 and k_scales.shape == (nb, bs, hkv)
    table = np.array([[4, 1, 5], [0, 2, 3]], np.int32)
    lens = np.array([40, 20], np.int32)
    q = torch.rand(2, hq, d) * 2 - 1
    out = simdattn.paged_attention(q, k8, v8, table, lens, k_format="int8",
                                   v_format="fp8_e4m3", k_scale=k_scales,
                                   v_scale=v_scale, target=target)
    k_ref = dequantize(k8.numpy(), k_scales.numpy(), "int8")
    v_ref = dequantize(v8.numpy(), v_scale, "fp8_e4m3")
    for s in range(2):
        rows = [table[s, j // bs] * bs + j % bs for j in range(lens[s])]
        ks = k_ref.reshape(nb * bs, hkv, d)[rows].transpose(1, 0, 2)[None]
        vs = v_ref.reshape(nb * bs, hkv, d)[rows].transpose(1, 0, 2)[None]
        o_ref, _ = reference(q[s][None, :, None].numpy(), ks, vs)
        err = np.max(np.abs(out[s].numpy() - o_ref[0, :, 0]))
        assert err <= 2e-5


def test_format_errors():
    q = np.zeros((1, 2, 1, 32), np.float32)
    k = np.zeros((1, 2, 4, 32), np.uint8)
    with pytest.raises(ValueError, match="k_scale"):
        simdattn.attention(q, k, k, k_format="int8", v_format="int8")
    with pytest.raises(ValueError, match="format"):
        simdattn.attention(q, k, k, k_format="int4", v_format="int8")
    with pytest.raises(ValueError, match="uint8 or int8"):
        simdattn.attention(q, q, q, k_format="fp8_e4m3")


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_append_kv_quantizes_as_quantize_kv(fmt, kv_layout):
    rng = np.random.default_rng(11)
    tokens, hkv, d, nb, bs, max_pos = 7, 2, 64, 3, 8, 20
    k_new = rng.uniform(-2, 2, (tokens, hkv, d)).astype(np.float32)
    v_new = rng.uniform(-2, 2, (tokens, hkv, d)).astype(np.float32)
    slots = np.array([5, -1, 17, 0, 9, 23, 2], np.int32)
    positions = rng.integers(0, max_pos, tokens).astype(np.int32)
    angles = rng.uniform(0, 6, (max_pos, d // 2)).astype(np.float32)
    rope = dict(positions=positions, cos=np.cos(angles), sin=np.sin(angles))
    shape = (nb, bs, hkv, d) if kv_layout == "NHD" else (nb, hkv, bs, d)
    k32, v32 = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    simdattn.append_kv(k_new, v_new, k32, v32, slots, kv_layout=kv_layout, **rope)
    scale = {"fp8_e4m3": 0.01, "fp8_e5m2": 0.5}.get(fmt)
    k_want, k_sc = simdattn.quantize_kv(k32, fmt, scale=scale)
    v_want, v_sc = simdattn.quantize_kv(v32, fmt, scale=scale)
    kq = np.full(k_want.shape, 0xA5, np.uint8)
    vq = np.full(v_want.shape, 0xA5, np.uint8)
    kwargs = {}
    if fmt == "int8":
        kwargs = dict(k_scales=np.full(k_sc.shape, -1, np.float32),
                      v_scales=np.full(v_sc.shape, -1, np.float32))
    elif scale is not None:
        kwargs = dict(k_scale=scale, v_scale=scale)
    simdattn.append_kv(k_new, v_new, kq, vq, slots, kv_layout=kv_layout, k_format=fmt,
                       v_format=fmt, **kwargs, **rope)
    for s in range(nb * bs):
        index = (s // bs, s % bs) if kv_layout == "NHD" else (s // bs, slice(None), s % bs)
        written = s in slots
        for got, want in ((kq, k_want), (vq, v_want)):
            if written:
                np.testing.assert_array_equal(got[index], want[index])
            else:
                assert (got[index] == 0xA5).all()
        if fmt == "int8":
            for got, want in ((kwargs["k_scales"], k_sc), (kwargs["v_scales"], v_sc)):
                np.testing.assert_array_equal(got[index], want[index] if written else -1)


def test_append_kv_quantized_errors():
    k_new = np.ones((2, 2, 32), np.float32)
    k8 = np.zeros((2, 8, 2, 32), np.uint8)
    scales = np.zeros((2, 8, 2), np.float32)
    with pytest.raises(ValueError, match="k_scales"):
        simdattn.append_kv(k_new, k_new, k8, k8.copy(), [0, 1], k_format="int8",
                           v_format="int8", v_scales=scales)
    with pytest.raises(ValueError, match="v_scales is given"):
        simdattn.append_kv(k_new, k_new, k8, k8.copy(), [0, 1], k_format="fp8_e4m3",
                           v_format="fp8_e5m2", v_scales=scales)
    with pytest.raises(ValueError, match="k_scale = 0"):
        simdattn.append_kv(k_new, k_new, k8, k8.copy(), [0, 1], k_format="fp8_e4m3",
                           v_format="fp8_e5m2", k_scale=0.0)
    assert (k8 == 0).all() and (scales == 0).all()
