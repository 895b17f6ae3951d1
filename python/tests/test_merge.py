"""simdattn.merge_states: attention over disjoint key ranges (slices of K
and V), merged, equals attention over all the keys, held to the float64
reference (conftest.py) and PyTorch within SEMANTICS.md's bounds on every
target; rows that some parts do not see (causal, kv lengths); NumPy and
torch operands of mixed dtypes; out= in place; errors."""

import numpy as np
import pytest
import torch

import simdattn
from conftest import (BOUNDS, LSE_BOUND, TORCH_DTYPES, as_f64, lse_error,
                      max_error, random, reference)


def bounds(lk, n):
    """[0, lk) in n near-equal ranges."""
    return [lk * i // n for i in range(n + 1)]


def split_attention(q, k, v, n, part_options=lambda k0, k1: {}, **kwargs):
    """Attention over each of n key ranges: ([O_i], [LSE_i])."""
    b = bounds(k.shape[2], n)
    outs, lses = [], []
    for k0, k1 in zip(b[:-1], b[1:]):
        o, lse = simdattn.attention(q, k[:, :, k0:k1], v[:, :, k0:k1], return_lse=True,
                                    **part_options(k0, k1), **kwargs)
        outs.append(o)
        lses.append(lse)
    return outs, lses


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_disjoint_key_ranges_merge_to_one_call(target, n):
    q, k, v = random((2, 4, 13, 16), seed=1), random((2, 2, 101, 16), seed=2), random((2, 2, 101, 24), seed=3)
    outs, lses = split_attention(q, k, v, n, target=target)
    o, lse = simdattn.merge_states(outs, lses)
    assert isinstance(o, np.ndarray) and o.dtype == np.float32 and o.shape == (2, 4, 13, 24)
    assert lse.dtype == np.float32 and lse.shape == (2, 4, 13)
    o_ref, lse_ref = reference(q, k, v)
    assert max_error(o, o_ref, v) <= BOUNDS["f32"]
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]
    whole, whole_lse = simdattn.attention(q, k, v, return_lse=True, target=target)
    assert max_error(o, as_f64(whole), v) <= BOUNDS["f32"]
    assert lse_error(lse, as_f64(whole_lse)) <= LSE_BOUND[True]


@pytest.mark.parametrize("n", [2, 4])
def test_causal_rows_that_see_no_key_of_a_part(target, n):
    """Top-left causal, Lq = Lk: the part with keys [k0, k1) hides key j'
    where k0 + j' > i (a boolean mask); rows i < k0 see none of its keys."""
    lq = lk = 40
    q, k, v = random((1, 2, lq, 16), seed=4), random((1, 2, lk, 16), seed=5), random((1, 2, lk, 16), seed=6)
    i = np.arange(lq)[:, None]
    masks = lambda k0, k1: {"mask": k0 + np.arange(k1 - k0)[None, :] <= i}
    outs, lses = split_attention(q, k, v, n, masks, target=target)
    assert np.all(np.isneginf(lses[-1][:, :, :lk // n]))  # rows before the last part
    o, lse = simdattn.merge_states(outs, lses)
    o_ref, lse_ref = reference(q, k, v, causal=True)
    assert max_error(o, o_ref, v) <= BOUNDS["f32"]
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]


def test_bottom_right_causal_as_a_window_per_part(target):
    """Queries as the last tokens: query i sees j <= i + Lk - Lq, on keys
    [k0, k1) j' <= i + (Lk - Lq - k0): window_right, top-left."""
    lq, lk = 6, 96
    q, k, v = random((2, 4, lq, 32), seed=7), random((2, 1, lk, 32), seed=8), random((2, 1, lk, 32), seed=9)
    window = lambda k0, k1: {"window": (-1, lk - lq - k0), "alignment": "top-left"}
    outs, lses = split_attention(q, k, v, 3, window, target=target)
    o, lse = simdattn.merge_states(outs, lses)
    o_ref, lse_ref = reference(q, k, v, causal=True, alignment="bottom-right")
    assert max_error(o, o_ref, v) <= BOUNDS["f32"]
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]


def test_kv_lengths_leave_parts_empty():
    lens = np.array([80, 20])
    q, k, v = random((2, 2, 9, 16), seed=10), random((2, 2, 80, 16), seed=11), random((2, 2, 80, 8), seed=12)
    lengths = lambda k0, k1: {"kv_lengths": np.clip(lens - k0, 0, k1 - k0)}
    outs, lses = split_attention(q, k, v, 4, lengths)
    assert np.all(np.isneginf(lses[3][1]))
    o, lse = simdattn.merge_states(outs, lses)
    o_ref, lse_ref = reference(q, k, v, kv_lengths=lens)
    assert max_error(o, o_ref, v) <= BOUNDS["f32"]
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]


def torch_sdpa64(q, k, v):
    """PyTorch's attention on the stored values in float64 (1.13 has no
    f16 CPU matmul); K/V heads repeated for GQA."""
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v).numpy()
    return torch.nn.functional._scaled_dot_product_attention(q, k, v, None, 0.0, False, False)[0].numpy()


@pytest.mark.parametrize("out_dtype", ["f32", "f16", "bf16"])
def test_torch_mixed_dtypes_against_torch(target, out_dtype):
    """Parts in f16, bf16 and f32 (torch tensors), merged into out_dtype:
    the bound of the narrowest type against PyTorch."""
    q = random((1, 4, 11, 16), "f32", "torch", 13)
    k, v = random((1, 2, 70, 16), "f32", "torch", 14), random((1, 2, 70, 40), "f32", "torch", 15)
    b = bounds(70, 3)
    outs, lses = [], []
    for k0, k1, dtype in zip(b[:-1], b[1:], ["f16", "bf16", "f32"]):
        o = torch.empty((1, 4, 11, 40), dtype=TORCH_DTYPES[dtype])
        _, lse = simdattn.attention(q, k[:, :, k0:k1], v[:, :, k0:k1], out=o, return_lse=True,
                                    target=target)
        outs.append(o)
        lses.append(lse)
    out = torch.empty((1, 4, 11, 40), dtype=TORCH_DTYPES[out_dtype])
    o, lse = simdattn.merge_states(outs, lses, out=out)
    assert o is out and isinstance(lse, torch.Tensor) and lse.shape == (1, 4, 11)
    assert max_error(o, torch_sdpa64(q, k, v), v) <= BOUNDS["bf16"]
    _, lse_ref = reference(q, k, v)
    assert lse_error(lse, lse_ref) <= LSE_BOUND[True]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_in_place_into_the_first_part(kind):
    q, k, v = random((2, 2, 7, 8), "f32", kind, 16), random((2, 2, 30, 8), "f32", kind, 17), random((2, 2, 30, 8), "f32", kind, 18)
    outs, lses = split_attention(q, k, v, 3)
    lses = [x.reshape(2, 2, 7, 1) for x in lses]  # the [B, H, L, 1] form too
    separate, separate_lse = simdattn.merge_states(outs, lses)
    o, lse = simdattn.merge_states(outs, lses, out=outs[0], threads=2)
    assert o is outs[0]
    np.testing.assert_array_equal(as_f64(o), as_f64(separate))
    np.testing.assert_array_equal(as_f64(lse), as_f64(separate_lse))


def test_rows_no_part_saw_and_nan_lse():
    outs = [np.full((1, 1, 3, 4), np.nan, np.float32), random((1, 1, 3, 4), seed=19)]
    lses = [np.full((1, 1, 3), -np.inf, np.float32), np.array([[[0.5, -np.inf, np.nan]]], np.float32)]
    o, lse = simdattn.merge_states(outs, lses, threads=1)
    np.testing.assert_array_equal(o[0, 0, 0], outs[1][0, 0, 0])
    assert lse[0, 0, 0] == np.float32(0.5)
    np.testing.assert_array_equal(o[0, 0, 1], np.zeros(4, np.float32))
    assert np.isneginf(lse[0, 0, 1])
    assert np.all(np.isnan(o[0, 0, 2])) and np.isnan(lse[0, 0, 2])


def test_errors():
    outs = [random((1, 2, 3, 4), seed=20), random((1, 2, 3, 4), seed=21)]
    lses = [np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 3), np.float32)]
    keep = [x.copy() for x in outs]
    with pytest.raises(ValueError, match=r"len\(lses\) = 1 but len\(outs\) = 2"):
        simdattn.merge_states(outs, lses[:1])
    with pytest.raises(ValueError, match="outs is empty"):
        simdattn.merge_states([], [])
    with pytest.raises(ValueError, match=r"lses\[1\] has shape \(1, 2, 4\)"):
        simdattn.merge_states(outs, [lses[0], np.zeros((1, 2, 4), np.float32)])
    with pytest.raises(ValueError, match=r"lses\[0\].dtype = float16"):
        simdattn.merge_states(outs, [lses[0].astype(np.float16), lses[1]])
    with pytest.raises(ValueError, match=r"outs\[1\].shape\[2\] \(L\) = 2: must equal outs\[0\].shape\[2\] = 3"):
        simdattn.merge_states([outs[0], outs[1][:, :, :2]], [lses[0], lses[1]])
    with pytest.raises(ValueError, match=r"out overlaps input outs\[1\]"):
        simdattn.merge_states(outs, lses, out=outs[1])
    with pytest.raises(ValueError, match="threads = 0"):
        simdattn.merge_states(outs, lses, threads=0)
    with pytest.raises(TypeError, match=r"outs\[0\] must be a NumPy array or a torch tensor"):
        simdattn.merge_states([[1.0]], lses[:1])
    for x, y in zip(outs, keep):
        np.testing.assert_array_equal(x, y)
