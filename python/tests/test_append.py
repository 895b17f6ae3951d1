"""simdattn.append_kv against a NumPy float64 reference: every dtype
pairing, NHD and HND caches, both rotary conventions with rotary_dim = D
and < D, q rotated in place, skipped tokens, integer types of the index
arrays, a torch rotate_half implementation of Llama's RoPE, thread counts,
and errors that name the argument and leave the caches untouched."""

import numpy as np
import pytest
import torch

import simdattn
from conftest import TORCH_DTYPES, as_f64

DTYPES = ("f32", "f16", "bf16")


def make(shape, dtype, kind="torch", seed=0, exact=True):
    """Values in `dtype`: dyadic ones (k / 16, |k| <= 128) whose rotation by
    a dyadic table is exact in f32, or uniform ones in [-2, 2)."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(-128, 128, size=shape) / 16.0 if exact
         else rng.uniform(-2.0, 2.0, size=shape)).astype(np.float32)
    if kind == "torch":
        return torch.from_numpy(x).to(TORCH_DTYPES[dtype])
    return x.astype(np.float16) if dtype == "f16" else x


def cache(num_blocks, block_size, heads, d, dtype, layout, kind="torch", fill=7.0):
    shape = ((num_blocks, block_size, heads, d) if layout == "NHD"
             else (num_blocks, heads, block_size, d))
    if kind == "torch":
        return torch.full(shape, fill, dtype=TORCH_DTYPES[dtype])
    return np.full(shape, fill, dtype=np.float16 if dtype == "f16" else np.float32)


def stored(x, like):
    """float64 values x rounded to the dtype of `like` (to nearest even)."""
    if isinstance(like, torch.Tensor):
        return as_f64(torch.from_numpy(x).to(like.dtype))
    return x.astype(like.dtype).astype(np.float64)


def dyadic_table(max_pos, half, seed):
    rng = np.random.default_rng(seed)
    return ((rng.integers(-64, 65, size=(max_pos, half)) / 64.0).astype(np.float32),
            (rng.integers(-64, 65, size=(max_pos, half)) / 64.0).astype(np.float32))


def rope(x, positions, cos, sin, interleaved):
    """Rotates the first 2 * cos.shape[1] dims of x [T, H, D] (float64)."""
    x = x.copy()
    half = cos.shape[1]
    c = as_f64(cos)[positions][:, None, :]
    s = as_f64(sin)[positions][:, None, :]
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, b * c + a * s
    return x


def expected_cache(before, rows, slots, layout):
    """before (float64, in `layout`) with token t's rows [H, D] at slot t."""
    out = before.copy()
    block_size = before.shape[1] if layout == "NHD" else before.shape[2]
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        b, r = divmod(int(slot), block_size)
        if layout == "NHD":
            out[b, r] = rows[t]
        else:
            out[b, :, r] = rows[t]
    return out


def random_slots(tokens, num_slots, seed, skip_every=0):
    slots = np.random.default_rng(seed).permutation(num_slots)[:tokens].astype(np.int32)
    if skip_every:
        slots[::skip_every] = -1
    return slots


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_copies_every_dtype_pairing_rounded_to_nearest_even(src, dst, layout):
    tokens, heads, dk, dv = 11, 2, 16, 8
    k_new = make((tokens, heads, dk), src, seed=1, exact=False)
    v_new = make((tokens, heads, dv), dst, seed=2, exact=False)
    k_cache = cache(3, 8, heads, dk, dst, layout)
    v_cache = cache(3, 8, heads, dv, src, layout)  # V converts the other way
    slots = random_slots(tokens, 24, 3, skip_every=4)
    before_k, before_v = as_f64(k_cache), as_f64(v_cache)
    simdattn.append_kv(k_new, v_new, k_cache, v_cache, slots, kv_layout=layout)
    want_k = stored(expected_cache(before_k, as_f64(k_new), slots, layout), k_cache)
    want_v = stored(expected_cache(before_v, as_f64(v_new), slots, layout), v_cache)
    assert np.array_equal(as_f64(k_cache), want_k)
    assert np.array_equal(as_f64(v_cache), want_v)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [32, 16])
@pytest.mark.parametrize("dtype,kind", [("f32", "numpy"), ("f16", "numpy"),
                                        ("bf16", "torch"), ("f16", "torch")])
def test_rotates_k_and_q_both_conventions_bit_exactly(interleaved, rotary_dim, dtype, kind):
    tokens, hq, hkv, d, max_pos = 9, 4, 2, 32, 50
    k_new = make((tokens, hkv, d), dtype, kind, seed=4)
    v_new = make((tokens, hkv, d), dtype, kind, seed=5)
    q = make((tokens, hq, d), dtype, kind, seed=6)
    k_cache = cache(2, 16, hkv, d, dtype, "NHD", kind)
    v_cache = cache(2, 16, hkv, d, dtype, "NHD", kind)
    cos, sin = dyadic_table(max_pos, rotary_dim // 2, 7)
    positions = np.random.default_rng(8).integers(0, max_pos, size=tokens).astype(np.int32)
    slots = random_slots(tokens, 32, 9, skip_every=3)
    before_k, before_q = as_f64(k_cache), as_f64(q)
    simdattn.append_kv(k_new, v_new, k_cache, v_cache, slots, q=q, positions=positions,
                       cos=cos, sin=sin, rotary_interleaved=interleaved)
    rotated_k = rope(as_f64(k_new), positions, cos, sin, interleaved)
    want_k = stored(expected_cache(before_k, rotated_k, slots, "NHD"), k_cache)
    assert np.array_equal(as_f64(k_cache), want_k)
    assert np.array_equal(as_f64(q), stored(rope(before_q, positions, cos, sin, interleaved), q))
    assert np.array_equal(as_f64(v_cache)[:, :, :, :],
                          stored(expected_cache(np.full(v_cache.shape, 7.0), as_f64(v_new),
                                                slots, "NHD"), v_cache))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_neox_matches_torch_rotate_half_with_a_real_table():
    """Llama's apply_rotary_pos_emb, written with torch ops on float64."""
    tokens, hq, hkv, d, max_pos, base = 40, 8, 2, 64, 2048, 10000.0
    inv_freq = 1.0 / base ** (np.arange(0, d, 2) / d)
    angles = np.arange(max_pos)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)  # float64: converted to float32
    positions = torch.arange(1000, 1000 + tokens, dtype=torch.int64)  # int64: converted
    k_new = make((tokens, hkv, d), "f32", seed=10, exact=False)
    v_new = make((tokens, hkv, d), "f32", seed=11, exact=False)
    q = make((tokens, hq, d), "f32", seed=12, exact=False)
    q0 = q.clone()
    k_cache = cache(8, 8, hkv, d, "f32", "HND")
    v_cache = cache(8, 8, hkv, d, "f32", "HND")
    slots = torch.arange(tokens, dtype=torch.int64) + 7
    simdattn.append_kv(k_new, v_new, k_cache, v_cache, slots, q=q, positions=positions,
                       cos=cos, sin=sin, kv_layout="HND")
    c32 = torch.from_numpy(cos.astype(np.float32)).double()[positions]
    s32 = torch.from_numpy(sin.astype(np.float32)).double()[positions]
    c = torch.cat((c32, c32), dim=-1)[:, None, :]
    s = torch.cat((s32, s32), dim=-1)[:, None, :]
    want_q = q0.double() * c + rotate_half(q0.double()) * s
    want_k = k_new.double() * c + rotate_half(k_new.double()) * s
    got_k = torch.stack([k_cache[(7 + t) // 8, :, (7 + t) % 8] for t in range(tokens)])
    assert torch.max(torch.abs(q.double() - want_q)) < 1e-5
    assert torch.max(torch.abs(got_k.double() - want_k)) < 1e-5


def test_views_into_a_fused_qkv_buffer_and_threads():
    tokens, hq, hkv, d = 300, 4, 2, 16
    qkv = make((tokens, hq + 2 * hkv, d), "bf16", seed=13, exact=False)
    cos, sin = dyadic_table(64, d // 2, 14)
    positions = np.arange(tokens, dtype=np.int32) % 64
    slots = random_slots(tokens, 40 * 8, 15, skip_every=7)
    results = []
    for threads in (1, 3):
        buf = qkv.clone()
        q, k, v = buf[:, :hq], buf[:, hq:hq + hkv], buf[:, hq + hkv:]
        k_cache = cache(40, 8, hkv, d, "bf16", "NHD")
        v_cache = cache(40, 8, hkv, d, "f16", "NHD")
        simdattn.append_kv(k, v, k_cache, v_cache, slots, q=q, positions=positions,
                           cos=cos, sin=sin, threads=threads)
        results.append((buf, k_cache, v_cache))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    buf, k_cache, _ = results[0]
    rotated = rope(as_f64(qkv[:, hq:hq + hkv]), positions, cos, sin, False)
    want = stored(expected_cache(np.full(k_cache.shape, 7.0), rotated, slots, "NHD"), k_cache)
    assert np.array_equal(as_f64(k_cache), want)
    assert torch.equal(buf[:, hq:], qkv[:, hq:])  # K and V inputs unchanged


@pytest.mark.parametrize("slots", [
    np.array([3, -1, 9, -5], np.int64),
    torch.tensor([3, -1, 9, -5], dtype=torch.int64),
    torch.tensor([3, -1, 9, -5], dtype=torch.int32),
    [3, -1, 9, -5],
])
def test_index_arrays_of_any_integer_type(slots):
    k_new, v_new = make((4, 1, 8), "f32", seed=16), make((4, 1, 8), "f32", seed=17)
    k_cache, v_cache = cache(2, 8, 1, 8, "f32", "NHD"), cache(2, 8, 1, 8, "f32", "NHD")
    simdattn.append_kv(k_new, v_new, k_cache, v_cache, slots)
    assert torch.equal(k_cache[0, 3, 0], k_new[0, 0])
    assert torch.equal(k_cache[1, 1, 0], k_new[2, 0])
    written = torch.zeros(16, dtype=torch.bool)
    written[[3, 9]] = True
    assert torch.all(k_cache.reshape(16, 8)[~written] == 7.0)  # skipped tokens: untouched


# ---------------------------------------------------------------- errors


def arguments(kind="numpy"):
    """A valid call with rotation: (positional arguments, keywords)."""
    k_new = make((5, 2, 16), "f32", kind, seed=18)
    v_new = make((5, 2, 8), "f32", kind, seed=19)
    k_cache = cache(2, 8, 2, 16, "f16", "NHD", kind)
    v_cache = cache(2, 8, 2, 8, "f32", "NHD", kind)
    cos, sin = dyadic_table(20, 8, 20)
    kw = dict(q=make((5, 4, 16), "f32", kind, seed=21),
              positions=np.array([0, 3, 19, 7, 1], np.int32), cos=cos, sin=sin)
    return [k_new, v_new, k_cache, v_cache, np.array([1, 2, 3, 15, -1], np.int32)], kw


def expect_rejected(needle, spoil, error=ValueError):
    args, kw = arguments()
    spoil(args, kw)
    snapshot = [np.array(x, copy=True) for x in (args[2], args[3], kw.get("q"))
                if isinstance(x, np.ndarray)]
    with pytest.raises(error, match=needle):
        simdattn.append_kv(*args, **kw)
    after = [x for x in (args[2], args[3], kw.get("q")) if isinstance(x, np.ndarray)]
    for a, b in zip(snapshot, after):
        assert np.array_equal(a, b, equal_nan=True), "a rejected call wrote its outputs"


def test_the_valid_call_of_the_error_tests_succeeds():
    args, kw = arguments()
    simdattn.append_kv(*args, **kw)


def set_item(container, key, value):
    container[key] = value


@pytest.mark.parametrize("needle,spoil", [
    (r"slot_mapping\[1\] and slot_mapping\[3\] are both 2: two tokens",
     lambda a, kw: set_item(a[4], 3, 2)),
    (r"slot_mapping\[0\] = 16: must be < num_blocks \* block_size = 16",
     lambda a, kw: set_item(a[4], 0, 16)),
    (r"slot_mapping has shape \(4,\): must be \(tokens = 5,\)",
     lambda a, kw: set_item(a, 4, np.array([1, 2, 3, 4], np.int32))),
    (r"slot_mapping has values outside the int32 range",
     lambda a, kw: set_item(a, 4, np.array([1, 2, 3, 2**40, -1], np.int64))),
    (r"slot_mapping.dtype = float32: must be an integer type",
     lambda a, kw: set_item(a, 4, np.zeros(5, np.float32))),
    (r"rotary.positions\[2\] = 20: must be in \[0, rotary.max_position = 20\)",
     lambda a, kw: set_item(kw["positions"], 2, 20)),
    (r"positions is given without sin", lambda a, kw: kw.pop("sin")),
    (r"cos is given without positions", lambda a, kw: kw.pop("positions")),
    (r"q is given without positions",
     lambda a, kw: [kw.pop(x) for x in ("positions", "cos", "sin")]),
    (r"sin has shape \(20, 4\) but cos has \(20, 8\)",
     lambda a, kw: set_item(kw, "sin", kw["sin"][:, :4])),
    (r"rotary.rotary_dim = 18: must be even and in \[2, Dk = 16\]",
     lambda a, kw: (set_item(kw, "cos", np.zeros((20, 9), np.float32)),
                    set_item(kw, "sin", np.zeros((20, 9), np.float32)))),
    (r"k_cache is read-only", lambda a, kw: a[2].setflags(write=False)),
    (r"q is read-only", lambda a, kw: kw["q"].setflags(write=False)),
    (r"v_cache.dtype = float64", lambda a, kw: set_item(a, 3, np.zeros((2, 8, 2, 8)))),
    (r"k_cache.shape\[2\] \(block_size\) = 12: must be a multiple of 8",
     lambda a, kw: (set_item(a, 2, np.zeros((2, 12, 2, 16), np.float16)),
                    set_item(a, 3, np.zeros((2, 12, 2, 8), np.float32)))),
    (r"k_cache has shape \(2, 8, 2, 8\): its heads and head_dim must be 2 and 16",
     lambda a, kw: set_item(a, 2, np.zeros((2, 8, 2, 8), np.float16))),
    (r"k_new has shape \(5, 2, 16\) and v_new \(4, 2, 8\)",
     lambda a, kw: set_item(a, 1, np.zeros((4, 2, 8), np.float32))),
    (r"q.shape\[1\] \(Hq\) = 3 is not a multiple of Hkv = 2",
     lambda a, kw: set_item(kw, "q", np.zeros((5, 3, 16), np.float32))),
    (r"q has shape \(5, 4, 8\): must be \[tokens = 5, Hq, head_dim = 16\]",
     lambda a, kw: set_item(kw, "q", np.zeros((5, 4, 8), np.float32))),
    (r"kv_layout = 'nhd'", lambda a, kw: set_item(kw, "kv_layout", "nhd")),
    (r"threads = 0", lambda a, kw: set_item(kw, "threads", 0)),
    (r"k_cache overlaps v_cache",
     lambda a, kw: set_item(a, 3, a[2][:, :, :, :8])),
])
def test_errors_name_the_argument_and_write_nothing(needle, spoil):
    expect_rejected(needle, spoil)


def test_operands_that_are_not_arrays_raise_type_error():
    expect_rejected(r"k_new must be a NumPy array or a torch tensor",
                    lambda a, kw: set_item(a, 0, [[1.0]]), TypeError)
    expect_rejected(r"cos must be a NumPy array or a torch tensor",
                    lambda a, kw: set_item(kw, "cos", [[1.0]]), TypeError)


def test_torch_errors_leave_caches_untouched():
    args, kw = arguments("torch")
    kw["positions"] = torch.tensor([0, 3, 19, 7, 1])
    args[4] = torch.tensor([1, 2, 3, 1, -1])
    before = [args[2].clone(), args[3].clone(), kw["q"].clone()]
    with pytest.raises(ValueError, match=r"slot_mapping\[0\] and slot_mapping\[3\] are both 1"):
        simdattn.append_kv(*args, **kw)
    for a, b in zip(before, (args[2], args[3], kw["q"])):
        assert torch.equal(a, b)
