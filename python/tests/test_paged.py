"""simdattn.paged_attention: ragged batches against a paged KV cache, held
to the float64 reference of each sequence (its pages gathered)."""

import numpy as np
import pytest
import torch

import simdattn
from conftest import BOUNDS, LSE_BOUND, as_f64, reference


def make_paged(rng, seqs, hq, hkv, d, block_size, kv_layout, dtype=np.float32):
    """A cache whose pages go to the sequences in a random order: (q, k_cache,
    v_cache, block_table, kv_lens, cu_seqlens_q)."""
    max_blocks = max(1, max(-(-lk // block_size) for _, lk in seqs)) + 1
    num_blocks = len(seqs) * max_blocks + 2
    pages = rng.permutation(num_blocks)
    table = np.full((len(seqs), max_blocks), -1, np.int32)
    n = 0
    for s, (_, lk) in enumerate(seqs):
        for b in range(-(-lk // block_size)):
            table[s, b] = pages[n]
            n += 1
    shape = ((num_blocks, block_size, hkv, d) if kv_layout == "NHD"
             else (num_blocks, hkv, block_size, d))
    k = rng.uniform(-1, 1, shape).astype(dtype)
    v = rng.uniform(-1, 1, shape).astype(dtype)
    cu = np.concatenate([[0], np.cumsum([lq for lq, _ in seqs])]).astype(np.int32)
    q = rng.uniform(-1, 1, (int(cu[-1]), hq, d)).astype(dtype)
    lens = np.array([lk for _, lk in seqs], np.int32)
    return q, k, v, table, lens, cu


def gather(cache, table, s, lk, block_size, kv_layout):
    """Sequence s's keys as [1, H, Lk, D] float64."""
    c = as_f64(cache)
    if kv_layout == "NHD":
        c = c.transpose(0, 2, 1, 3)
    rows = [c[table[s, j // block_size], :, j % block_size, :] for j in range(lk)]
    if not rows:
        return np.zeros((1, c.shape[1], 0, c.shape[3]))
    return np.stack(rows, axis=1)[None]


def check(q, k, v, table, lens, cu, out, lse, block_size, kv_layout, bound, lse_bound,
          **options):
    for s in range(len(lens)):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        lq, lk = int(cu[s + 1] - cu[s]), int(lens[s])
        if lq == 0:
            continue
        got = as_f64(out)[rows].transpose(1, 0, 2)  # [Hq, Lq, D]
        if lk == 0:
            assert np.all(got == 0)
            assert np.all(np.isneginf(as_f64(lse)[:, rows]))
            continue
        ks = gather(k, table, s, lk, block_size, kv_layout)
        vs = gather(v, table, s, lk, block_size, kv_layout)
        qs = as_f64(q)[rows].transpose(1, 0, 2)[None]
        o_ref, lse_ref = reference(qs, ks, vs, alignment="bottom-right", **options)
        err = np.max(np.abs(got - o_ref[0])) / max(1.0, np.max(np.abs(vs)))
        assert err <= bound, f"sequence {s}: error {err}"
        finite = np.isfinite(lse_ref[0])
        assert np.all(np.abs(as_f64(lse)[:, rows][finite] - lse_ref[0][finite]) <= lse_bound)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_mixed_batch_numpy(target, kv_layout, causal):
    rng = np.random.default_rng(11)
    seqs = [(1, 300), (4, 90), (20, 64), (0, 30), (1, 0), (2, 17)]
    q, k, v, table, lens, cu = make_paged(rng, seqs, 8, 2, 32, 16, kv_layout)
    out, lse = simdattn.paged_attention(q, k, v, table, lens, cu_seqlens_q=cu,
                                        causal=causal, kv_layout=kv_layout,
                                        return_lse=True, target=target)
    assert out.shape == (int(cu[-1]), 8, 32) and out.dtype == np.float32
    assert lse.shape == (8, int(cu[-1]))
    check(q, k, v, table, lens, cu, out, lse, 16, kv_layout, BOUNDS["f32"],
          LSE_BOUND[True], causal=causal)


def test_decode_step_torch_bf16_with_options():
    rng = np.random.default_rng(12)
    seqs = [(1, 700), (1, 33), (1, 2000), (1, 8)]
    q, k, v, table, lens, _ = make_paged(rng, seqs, 8, 2, 64, 32, "NHD")
    qt, kt, vt = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    sinks = np.array([0.5, -1, 2, 0, 1, 1, -2, 3], np.float32)
    out, lse = simdattn.paged_attention(
        qt, kt, vt, torch.from_numpy(table), torch.from_numpy(lens), softcap=5.0,
        sinks=sinks, window=(100, 0), return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    cu = np.arange(len(seqs) + 1, dtype=np.int32)
    check(qt, kt, vt, table, lens, cu, out, lse, 32, "NHD", BOUNDS["bf16"],
          LSE_BOUND[False], softcap=5.0, sinks=sinks, window=(100, 0), causal=True)


def test_writes_given_out():
    rng = np.random.default_rng(13)
    q, k, v, table, lens, cu = make_paged(rng, [(3, 40), (2, 10)], 4, 4, 16, 8, "HND")
    out = np.full((5, 4, 16), 7.0, np.float32)
    got = simdattn.paged_attention(q, k, v, table, lens, cu_seqlens_q=cu, out=out,
                                   kv_layout="HND")
    assert got is out and not np.any(out == 7.0)


def test_errors_name_the_argument_and_write_nothing():
    rng = np.random.default_rng(14)
    q, k, v, table, lens, cu = make_paged(rng, [(1, 40), (1, 10)], 4, 2, 16, 16, "NHD")
    out = np.full((2, 4, 16), 7.0, np.float32)
    bad = table.copy()
    bad[1, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\]"):
        simdattn.paged_attention(q, k, v, bad, lens, out=out)
    with pytest.raises(ValueError, match=r"kv_lens\[0\]"):
        simdattn.paged_attention(q, k, v, table, np.array([-1, 10]), out=out)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        simdattn.paged_attention(q, k, v, table, lens, cu_seqlens_q=[0, 1], out=out)
    with pytest.raises(ValueError, match="block_table has 1 rows"):
        simdattn.paged_attention(q, k, v, table[:1], lens, out=out)
    with pytest.raises(ValueError, match="kv_layout"):
        simdattn.paged_attention(q, k, v, table, lens, kv_layout="nhd")
    assert np.all(out == 7.0)
