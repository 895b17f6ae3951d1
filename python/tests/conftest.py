"""Shared by the Python tests: the targets to run on, a float64 NumPy
reference of docs/SEMANTICS.md, the error bounds, and the glue to torch."""

import os

import numpy as np
import pytest
import torch

import simdattn

# Every target this CPU runs; SIMDATTN_EXPECT_TARGETS (set by CMake from
# the CI's CPU flags) must all be among them (test_info checks it).
TARGETS = simdattn.info()["available"]
EXPECTED_TARGETS = os.environ.get("SIMDATTN_EXPECT_TARGETS", "").split()

# SEMANTICS.md: max|O - O_ref| / max(1, max|V|) by the narrowest storage type.
BOUNDS = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}
LSE_BOUND = {True: 1e-4, False: 1e-2}  # Q and K both f32, or not

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


def as_f64(x):
    """The values of an array or tensor as stored, widened to float64."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def reference(q, k, v, *, scale=None, causal=False, alignment=None, mask=None,
              kv_lengths=None, window=(-1, -1), softcap=0.0, alibi_slopes=None,
              sinks=None):
    """SEMANTICS.md in float64 on logical [B, H, S, D] arrays: (O, LSE).
    A row with no visible key (and no sink) gives zeros and LSE = -inf."""
    q, k, v = as_f64(q), as_f64(k), as_f64(v)
    b_, hq, lq, dk = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = hq // hkv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(dk) if scale is None else scale
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    lens = np.full(b_, lk) if kv_lengths is None else np.asarray(kv_lengths, np.int64)
    i = np.arange(lq)[None, :, None]
    j = np.arange(lk)[None, None, :]
    offset = (lens - lq)[:, None, None] if alignment == "bottom-right" else 0
    pos = i + offset  # [B or 1, Lq, 1]
    visible = np.broadcast_to(j < lens[:, None, None], (b_, lq, lk)).copy()
    if causal:
        visible &= j <= pos
    if window[0] >= 0:
        visible &= j >= pos - window[0]
    if window[1] >= 0:
        visible &= j <= pos + window[1]
    visible = np.broadcast_to(visible[:, None], s.shape).copy()
    if alibi_slopes is not None:
        slopes = as_f64(alibi_slopes)[None, :, None, None]
        s = s - slopes * np.abs(np.broadcast_to(pos, (b_, lq, 1))[:, None] - j[:, None])
    if mask is not None:
        m = np.broadcast_to(as_f64(mask), s.shape)
        if np.asarray(mask).dtype == np.bool_ or (isinstance(mask, torch.Tensor)
                                                  and mask.dtype == torch.bool):
            visible &= m != 0
        else:
            visible &= m != -np.inf
            s = s + np.where(m == -np.inf, 0.0, m)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, as_f64(sinks)[None, :, None, None])
    safe_m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(visible, np.exp(s - safe_m), 0.0)
    z = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        z = z + np.exp(as_f64(sinks)[None, :, None, None] - safe_m)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(z > 0, np.einsum("bhij,bhjd->bhid", p, v) / np.where(z > 0, z, 1), 0.0)
        lse = np.where(z[..., 0] > 0, safe_m[..., 0] + np.log(np.where(z[..., 0] > 0, z[..., 0], 1)),
                       -np.inf)
    return o, lse


def max_error(o, o_ref, v):
    """SEMANTICS.md's error: max|O - O_ref| / max(1, max|V|)."""
    return np.max(np.abs(as_f64(o) - o_ref)) / max(1.0, np.max(np.abs(as_f64(v))))


def lse_error(lse, lse_ref):
    lse = as_f64(lse)
    same_inf = np.isneginf(lse) & np.isneginf(lse_ref)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both are -inf
        return np.max(np.where(same_inf, 0.0, np.abs(lse - lse_ref)))


def random(shape, dtype="f32", kind="numpy", seed=0, lo=-1.0, hi=1.0):
    """Uniform values in [lo, hi) stored in `dtype` (f16 for NumPy, any
    for torch)."""
    x = np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)
    if kind == "torch":
        return torch.from_numpy(x).to(TORCH_DTYPES[dtype])
    return x.astype(np.float16) if dtype == "f16" else x
