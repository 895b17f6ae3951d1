"""simdattn.attention against PyTorch's scaled_dot_product_attention and
the float64 reference (conftest.py), on every target of this CPU: f32, f16,
bf16; causal with both alignments; masks; GQA; every option; BSHD views,
non-contiguous and negative-stride operands; out= in place; the kind of
the result; dropout's rule; the GIL released during the call."""

import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import simdattn
from conftest import (BOUNDS, EXPECTED_TARGETS, LSE_BOUND, TARGETS, as_f64,
                      lse_error, max_error, random, reference)


def torch_sdpa(q, k, v, mask=None, causal=False):
    """PyTorch's attention in float64 on the stored values (its CPU kernels
    lack f16 matmuls); K/V heads repeated for GQA (1.13 has no GQA)."""
    q, k, v = (x.detach().to(torch.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:  # PyTorch >= 2.0
        return sdpa(q, k, v, attn_mask=mask, is_causal=causal).numpy()
    out, _ = F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, causal)
    return out.numpy()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "gqa"])
def test_matches_torch_sdpa(target, dtype, case):
    b, hq, hkv, lq, lk, d = 2, 4, 4, 33, 33, 24
    if case == "gqa":
        hkv, lq, lk = 2, 17, 70
    q = random((b, hq, lq, d), dtype, "torch", 1)
    k = random((b, hkv, lk, d), dtype, "torch", 2)
    v = random((b, hkv, lk, d), dtype, "torch", 3)
    mask = None
    if case == "bool_mask":
        mask = torch.from_numpy(np.random.default_rng(4).random((lq, lk)) < 0.7)
        mask[:, 0] = True  # PyTorch gives NaN for rows with no key
    causal = case == "causal"
    o, lse = simdattn.attention(q, k, v, mask=mask, causal=causal, return_lse=True,
                                target=target)
    assert isinstance(o, torch.Tensor) and o.dtype == q.dtype and o.shape == q.shape
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    expect = torch_sdpa(q, k, v, mask, causal)
    assert max_error(o, expect, v) <= BOUNDS[dtype]
    _, lse_ref = reference(q, k, v, mask=mask, causal=causal,
                           alignment="top-left" if causal else None)
    assert lse_error(lse, lse_ref) <= LSE_BOUND[dtype == "f32"]


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("lq,lk", [(20, 45), (45, 20), (1, 300), (3, 300)])
def test_causal_both_alignments(target, alignment, lq, lk):
    q = random((2, 4, lq, 16), seed=5)
    k = random((2, 2, lk, 16), seed=6)
    v = random((2, 2, lk, 8), seed=7)
    o, lse = simdattn.attention(q, k, v, causal=True, alignment=alignment,
                                return_lse=True, target=target)
    o_ref, lse_ref = reference(q, k, v, causal=True, alignment=alignment)
    assert max_error(o, o_ref, v) <= BOUNDS["f32"]
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]
    if alignment == "top-left" and lq <= lk:  # PyTorch's is_causal
        expect = torch_sdpa(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
        assert max_error(o, expect, v) <= BOUNDS["f32"]


def test_causal_top_left_rows_past_lk_see_every_key():
    q, k, v = random((1, 1, 5, 8), seed=1), random((1, 1, 3, 8), seed=2), random((1, 1, 3, 8), seed=3)
    o = simdattn.attention(q, k, v, causal=True, alignment="top-left")
    plain = simdattn.attention(q, k, v)
    np.testing.assert_array_equal(o[:, :, 2:], plain[:, :, 2:])


OPTION_CASES = {
    "additive_mask_f32": lambda rng, b, hq, lq, lk: dict(
        mask=rng.uniform(-3, 3, (1, hq, lq, lk)).astype(np.float32)),
    "additive_mask_f16_2d": lambda rng, b, hq, lq, lk: dict(
        mask=rng.uniform(-3, 3, (lq, lk)).astype(np.float16)),
    "bool_mask_per_batch": lambda rng, b, hq, lq, lk: dict(
        mask=rng.random((b, 1, 1, lk)) < 0.5),
    "kv_lengths_int32": lambda rng, b, hq, lq, lk: dict(
        kv_lengths=np.array([lk, lk // 3], np.int32), causal=True, alignment="bottom-right"),
    "kv_lengths_list": lambda rng, b, hq, lq, lk: dict(
        kv_lengths=[0, lk - 1], alignment="top-left", window=(5, 2)),
    "window_softcap": lambda rng, b, hq, lq, lk: dict(
        window=(7, 0), causal=True, alignment="bottom-right", softcap=3.0),
    "alibi_sinks_scale": lambda rng, b, hq, lq, lk: dict(
        alibi_slopes=[2.0 ** -(h + 1) for h in range(hq)],
        sinks=np.linspace(-1, 1, hq).astype(np.float32), scale=0.4, alignment="top-left"),
    "kv_lengths_torch_int32": lambda rng, b, hq, lq, lk: dict(
        kv_lengths=torch.tensor([lk // 2, lk], dtype=torch.int32), alignment="bottom-right",
        alibi_slopes=torch.full((hq,), 0.25)),
}


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_options_match_reference(target, case):
    b, hq, hkv, lq, lk, d = 2, 4, 2, 19, 41, 16
    rng = np.random.default_rng(11)
    options = OPTION_CASES[case](rng, b, hq, lq, lk)
    q, k, v = random((b, hq, lq, d), seed=12), random((b, hkv, lk, d), seed=13), random((b, hkv, lk, d), seed=14)
    o, lse = simdattn.attention(q, k, v, return_lse=True, target=target, **options)
    o_ref, lse_ref = reference(q, k, v, **options)
    narrow = "f16" if case == "additive_mask_f16_2d" else "f32"
    assert max_error(o, o_ref, v) <= BOUNDS["f32"], narrow
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bshd_views_and_non_contiguous_operands(target, kind):
    b, hq, hkv, lq, lk, d = 2, 4, 2, 9, 30, 16
    # BSHD storage, as engines keep their KV caches.
    q = random((b, lq, hq, d), "f32", kind, 21)
    k = random((b, lk, hkv, d), "f32", kind, 22)
    v = random((b, lk, hkv, d), "f32", kind, 23)
    o = simdattn.attention(q, k, v, layout="bshd", causal=True, alignment="bottom-right",
                           target=target)
    assert tuple(o.shape) == (b, lq, hq, d)
    t = (lambda x: x.transpose(0, 2, 1, 3)) if kind == "numpy" else (lambda x: x.transpose(1, 2))
    o_ref, _ = reference(t(q), t(k), t(v), causal=True, alignment="bottom-right")
    assert max_error(t(o), o_ref, v) <= BOUNDS["f32"]
    # The same tensors as non-contiguous BHSD views, strided and padded.
    big = random((b, hkv, 2 * lk, d + 5), "f32", kind, 24)
    k2 = big[:, :, ::2, :d]
    o2 = simdattn.attention(t(q), k2, t(v), target=target)
    o2_ref, _ = reference(t(q), k2, t(v))
    assert max_error(o2, o2_ref, v) <= BOUNDS["f32"]


def test_negative_strides_read_in_place(target):
    q, k, v = random((1, 2, 7, 8), seed=31), random((1, 2, 12, 8), seed=32), random((1, 2, 12, 8), seed=33)
    kf, vf = k[:, :, ::-1], v[:, :, ::-1]  # keys reversed: a view, no copy
    assert kf.strides[2] < 0
    o = simdattn.attention(q, kf, vf, target=target)
    o_ref, _ = reference(q, kf, vf)
    assert max_error(o, o_ref, v) <= BOUNDS["f32"]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_out_is_written_in_place_and_returned(kind):
    q, k, v = (random((1, 2, 5, 8), "f16", kind, s) for s in (41, 42, 43))
    out = (np.full if kind == "numpy" else torch.full)((1, 2, 5, 8), 7.0)
    if kind == "torch":
        out = out.to(torch.float32)
    else:
        out = out.astype(np.float32)
    result, lse = simdattn.attention(q, k, v, out=out, return_lse=True)
    assert result is out
    assert type(lse) is type(out)
    o_ref, _ = reference(q, k, v)
    assert max_error(out, o_ref, v) <= BOUNDS["f16"]


def test_result_is_of_the_callers_kind():
    q, k, v = (random((1, 1, 4, 8), "f16", "numpy", s) for s in (51, 52, 53))
    o = simdattn.attention(q, k, v)
    assert isinstance(o, np.ndarray) and o.dtype == np.float16
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    to = simdattn.attention(tq, tk, tv)
    assert isinstance(to, torch.Tensor) and to.dtype == torch.float16
    np.testing.assert_array_equal(o, to.numpy())


def test_dropout_zeroes_or_scales_each_weight():
    # V = identity (Dv = Lk), so each output row is the row's weights.
    lq, lk, p = 6, 40, 0.5
    q, k = random((1, 2, lq, 8), seed=61), random((1, 1, lk, 8), seed=62)
    v = np.broadcast_to(np.eye(lk, dtype=np.float32), (1, 1, lk, lk))
    plain = simdattn.attention(q, k, v)
    dropped = simdattn.attention(q, k, v, dropout_p=p, seed=1234, threads=1)
    kept = dropped != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(dropped[kept], plain[kept] / (1 - p), rtol=1e-5)
    again = simdattn.attention(q, k, v, dropout_p=p, seed=1234, threads=2)
    np.testing.assert_array_equal(dropped, again)
    other = simdattn.attention(q, k, v, dropout_p=p, seed=1235)
    assert not np.array_equal(dropped, other)


def test_gil_is_released_during_the_call():
    # A Python thread stamps the time as fast as it can while one long call
    # runs. Holding the GIL, the call would leave a gap in the stamps as
    # long as itself (the thread could run only before and after it);
    # released, the stamps cover it.
    q = random((1, 8, 1024, 64), seed=71)
    k, v = random((1, 8, 4096, 64), seed=72), random((1, 8, 4096, 64), seed=73)
    stamps, stop = [], threading.Event()

    def stamp():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    thread = threading.Thread(target=stamp)
    thread.start()
    time.sleep(0.01)
    start = time.perf_counter()
    simdattn.attention(q, k, v, threads=1, target=TARGETS[0])
    end = time.perf_counter()
    stop.set()
    thread.join()
    inside = [start] + [t for t in stamps if start < t < end] + [end]
    longest_gap = max(b - a for a, b in zip(inside, inside[1:]))
    assert end - start > 0.03, "the call is too short to tell"
    assert longest_gap < (end - start) / 2, (longest_gap, end - start)


def test_target_argument_caps_the_call(monkeypatch):
    seen = []
    inner = simdattn._simdattn.attention

    def spy(*args):
        result = inner(*args)
        seen.append(result[2])
        return result

    monkeypatch.setattr(simdattn._simdattn, "attention", spy)
    q = random((1, 1, 3, 8), seed=81)
    for target in TARGETS:
        simdattn.attention(q, q, q, target=target)
    simdattn.attention(q, q, q)
    assert seen == TARGETS + [simdattn.info()["selected"]]


def test_info_and_version():
    info = simdattn.info()
    assert set(info) == {"compiled", "available", "selected", "max_target_error"}
    assert info["compiled"][-1] == "SCALAR"
    assert set(info["available"]) <= set(info["compiled"])
    assert info["selected"] in info["available"]
    assert info["max_target_error"] is None
    for t in EXPECTED_TARGETS:  # the CI's CPU has them: none may go missing
        assert t in info["available"], t
    parts = simdattn.__version__.split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts)
