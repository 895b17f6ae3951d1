"""simdattn: fused scaled dot-product attention on CPUs.

    out = simdattn.attention(q, k, v, causal=True, alignment="bottom-right")
    simdattn.append_kv(k_new, v_new, k_cache, v_cache, slot_mapping)
    k8, k_scales = simdattn.quantize_kv(k, "int8")
    out = simdattn.paged_attention(q, k_cache, v_cache, block_table, kv_lens)
    out, lse = simdattn.merge_states([o1, o2], [lse1, lse2])

q, k, v (and out, mask) are NumPy arrays or PyTorch CPU tensors, read in
place through their strides; the result is of q's kind. Every option is
docs/SEMANTICS.md's. NumPy and PyTorch are each needed only for their own
arrays.
"""

import array as _array
import math as _math

from . import _simdattn

__all__ = ["append_kv", "attention", "merge_states", "paged_attention", "info",
           "quantize_kv", "__version__"]

__version__ = _simdattn.version()

_F32, _F16, _BF16, _BOOL = 0, 1, 2, 3
_I32, _I64 = 4, 5
# Quantized K/V formats (SEMANTICS.md "Quantized KV caches") and the
# largest finite fp8 values.
_FORMATS = {"int8": 6, "q8_0": 7, "fp8_e4m3": 8, "fp8_e5m2": 9}
_FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
_ERRORS = {
    _simdattn.INVALID_ARGUMENT: ValueError,
    _simdattn.UNIMPLEMENTED: NotImplementedError,
    _simdattn.OUT_OF_MEMORY: MemoryError,
    _simdattn.INTERNAL: RuntimeError,
}
_ALIGNMENTS = {None: 0, "top-left": 1, "bottom-right": 2}


def info():
    """The code paths of this build: a dict with "compiled" and "available"
    (names, best first), "selected" (what the next call without a target
    runs) and "max_target_error" (why SIMDATTN_MAX_TARGET is ignored, or
    None)."""
    return _simdattn.info()


class _Operand:
    """A 4-D (or shorter) array as the library reads it: address, dtype
    code, shape and strides in elements, and whether it is a torch tensor."""

    def __init__(self, address, dtype, shape, strides, torch_kind, writable):
        self.address = address
        self.dtype = dtype
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.torch_kind = torch_kind
        self.writable = writable

    def as_tuple(self):
        return (self.address, self.dtype, self.shape, self.strides)


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _is_numpy(x):
    return type(x).__module__.split(".")[0] == "numpy" and hasattr(x, "__array_interface__")


def _numpy_dtype_code(x, name, allowed):
    kind, size = x.dtype.kind, x.dtype.itemsize
    code = {("f", 4): _F32, ("f", 2): _F16, ("b", 1): _BOOL}.get((kind, size))
    if code is None or code not in allowed or not x.dtype.isnative:
        raise ValueError(f"{name}.dtype = {x.dtype}: must be one of "
                         f"{_names(allowed, 'numpy')}")
    return code


def _torch_dtype_code(x, name, allowed):
    import torch
    code = {torch.float32: _F32, torch.float16: _F16, torch.bfloat16: _BF16,
            torch.bool: _BOOL}.get(x.dtype)
    if code is None or code not in allowed:
        raise ValueError(f"{name}.dtype = {x.dtype}: must be one of "
                         f"{_names(allowed, 'torch')}")
    return code


def _names(codes, kind):
    names = {_F32: "float32", _F16: "float16", _BF16: "bfloat16", _BOOL: "bool"}
    return ", ".join(names[c] for c in codes if kind == "torch" or c != _BF16)


def _describe(x, name, allowed=(_F32, _F16, _BF16)):
    """The operand `name` (a NumPy array or a torch CPU tensor)."""
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}: simdattn reads CPU tensors")
        if x.layout != torch.strided:
            raise ValueError(f"{name} has layout {x.layout}: must be strided (dense)")
        code = _torch_dtype_code(x, name, allowed)
        return _Operand(x.data_ptr(), code, x.shape, x.stride(), True, True)
    if _is_numpy(x):
        code = _numpy_dtype_code(x, name, allowed)
        size = x.dtype.itemsize
        if any(s % size for s in x.strides):
            raise ValueError(f"{name}.strides = {x.strides} (bytes): must be "
                             f"multiples of the item size {size}")
        address = x.__array_interface__["data"][0]
        strides = tuple(s // size for s in x.strides)
        return _Operand(address, code, x.shape, strides, False, x.flags.writeable)
    raise TypeError(f"{name} must be a NumPy array or a torch tensor, "
                    f"got {type(x).__name__}")


def _describe_quantized(x, name, fmt):
    """A K or V array stored in quantized format `fmt` (uint8 or int8 bytes;
    q8_0: the last dimension holds D / 32 blocks of 34 bytes), as the
    logical operand of D values per row (strides in bytes)."""
    if fmt not in _FORMATS:
        raise ValueError(f"{name} format = {fmt!r}: must be one of "
                         f"{', '.join(_FORMATS)} (or None)")
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}: simdattn reads CPU tensors")
        if x.dtype not in (torch.uint8, torch.int8):
            raise ValueError(f"{name}.dtype = {x.dtype}: a {fmt} array must be uint8 or int8")
        op = _Operand(x.data_ptr(), _FORMATS[fmt], x.shape, x.stride(), True, True)
    elif _is_numpy(x):
        if x.dtype.itemsize != 1 or x.dtype.kind not in "ui":
            raise ValueError(f"{name}.dtype = {x.dtype}: a {fmt} array must be uint8 or int8")
        op = _Operand(x.__array_interface__["data"][0], _FORMATS[fmt], x.shape,
                      x.strides, False, x.flags.writeable)
    else:
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, "
                        f"got {type(x).__name__}")
    if fmt == "q8_0" and len(op.shape) > 0:
        if op.shape[-1] % 34 != 0:
            raise ValueError(f"{name}.shape[-1] = {op.shape[-1]}: a q8_0 row is "
                             "D / 32 blocks of 34 bytes")
        op.shape = op.shape[:-1] + (op.shape[-1] // 34 * 32,)
    return op


def _kv_operand(x, name, fmt):
    return _describe(x, name) if fmt is None else _describe_quantized(x, name, fmt)


def _kv_scales(fmt, scale, name, op_shape, swap):
    """The scale of a K or V in format `fmt`: for int8 the operand of its
    per-row float32 scales (op_shape[:3] as given by the caller: swap says
    whether its dimensions 1 and 2 are the logical ones swapped), for fp8
    the float; (operand or None, float)."""
    if fmt == "int8":
        if scale is None:
            raise ValueError(f"{name}: an int8 array needs its per-token scales")
        op = _describe(scale, name, (_F32,))
        if len(op.shape) != 3:
            raise ValueError(f"{name} has shape {op.shape}: must be 3-D, one "
                             "scale per token and head")
        op.shape += (1,)
        op.strides += (1,)
        if swap:
            op.shape = (op.shape[0], op.shape[2], op.shape[1], 1)
            op.strides = (op.strides[0], op.strides[2], op.strides[1], 1)
        return op, 1.0
    if fmt in _FP8_MAX:
        value = 1.0 if scale is None else scale
        if not isinstance(value, (int, float)):
            raise ValueError(f"{name} = {scale!r}: an fp8 scale is a number")
        return None, float(value)
    if scale is not None:
        raise ValueError(f"{name} is set but the format is {fmt or 'unquantized'}: "
                         "only int8 (per-token) and fp8 (per-tensor) take scales")
    return None, 1.0


def _set_kv_scales(options, k_format, v_format, k_scale, v_scale, k_shape, v_shape, swap):
    k_op, k_value = _kv_scales(k_format, k_scale, "k_scale", k_shape, swap)
    v_op, v_value = _kv_scales(v_format, v_scale, "v_scale", v_shape, swap)
    options.set_kv_scales(None if k_op is None else k_op.as_tuple(),
                          None if v_op is None else v_op.as_tuple(),
                          True, k_value, v_value)


def _four_d(op, name, layout):
    """The logical [B, H, S, D] view of a 4-D operand given in `layout`."""
    if len(op.shape) != 4:
        raise ValueError(f"{name} has {len(op.shape)} dimensions, shape "
                         f"{op.shape}: must be 4-D ({layout.upper()})")
    if layout == "bshd":
        op.shape = (op.shape[0], op.shape[2], op.shape[1], op.shape[3])
        op.strides = (op.strides[0], op.strides[2], op.strides[1], op.strides[3])
    return op


def _vector(x, name, want, integer):
    """An option array of `want` entries: (address, count, dtype code) and
    the object holding its memory. Integer arrays may be int32 or int64
    (read in place when contiguous); float ones become float32."""
    if x is None:
        return (0, 0, _I64), None
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}: must be on the CPU")
        if integer and (x.dtype.is_floating_point or x.dtype.is_complex):
            raise ValueError(f"{name}.dtype = {x.dtype}: must be an integer type")
        if integer and x.dtype not in (torch.int32, torch.int64):
            x = x.to(torch.int64)
        if not integer and x.dtype != torch.float32:
            x = x.to(torch.float32)
        x = x.contiguous()
        shape, address = tuple(x.shape), x.data_ptr()
        code = _I32 if x.dtype == torch.int32 else _I64
    elif _is_numpy(x):
        import numpy as np
        if integer and x.dtype.kind not in "iub":
            raise ValueError(f"{name}.dtype = {x.dtype}: must be an integer type")
        if integer and x.dtype not in (np.int32, np.int64):
            x = x.astype(np.int64)
        if not integer and x.dtype != np.float32:
            x = x.astype(np.float32)
        x = np.ascontiguousarray(x)
        shape, address = x.shape, x.__array_interface__["data"][0]
        code = _I32 if x.dtype == np.int32 else _I64
    else:
        try:
            x = _array.array("q" if integer else "f", x)
        except (TypeError, OverflowError) as e:
            raise ValueError(f"{name}: {e}") from None
        shape, address, code = (len(x),), x.buffer_info()[0], _I64
    if len(shape) != 1 or shape[0] != want:
        what = "B" if integer else "Hq"
        raise ValueError(f"{name} has shape {shape}: must be ({what} = {want},)")
    return (address, want, code), x


def _mask(mask):
    """The mask as a logical [B, Hq, Lq, Lk] operand (NumPy broadcasting:
    missing leading dimensions are 1)."""
    if mask is None:
        return None
    op = _describe(mask, "mask", (_BOOL, _F32, _F16))
    if not 1 <= len(op.shape) <= 4:
        raise ValueError(f"mask has shape {op.shape}: must have 1 to 4 "
                         "dimensions broadcasting to [B, Hq, Lq, Lk]")
    pad = 4 - len(op.shape)
    op.shape = (1,) * pad + op.shape
    op.strides = (0,) * pad + op.strides
    return op


def _new_like(op, shape, dtype_code):
    """A new array of `shape`, of op's kind (ndarray or tensor)."""
    if op.torch_kind:
        import torch
        dtype = {_F32: torch.float32, _F16: torch.float16, _BF16: torch.bfloat16}[dtype_code]
        return torch.empty(shape, dtype=dtype)
    import numpy as np
    return np.empty(shape, dtype={_F32: np.float32, _F16: np.float16}[dtype_code])


def _check_scalars(scale, window, softcap, dropout_p, seed, threads, target):
    if scale is not None and not (isinstance(scale, (int, float)) and _math.isfinite(scale)
                                  and scale >= 0):
        raise ValueError(f"scale = {scale!r}: must be None or a finite number >= 0")
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) for w in window)):
        raise ValueError(f"window = {window!r}: must be (left, right), "
                         "two ints (negative: unbounded)")
    if any(abs(w) >= 2**63 for w in window):
        raise ValueError(f"window = {window!r}: out of the int64 range")
    for what, x in (("softcap", softcap), ("dropout_p", dropout_p)):
        if not isinstance(x, (int, float)):
            raise ValueError(f"{what} = {x!r}: must be a number")
    if not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed = {seed!r}: must be an int in [0, 2**64)")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 1024):
        raise ValueError(f"threads = {threads!r}: must be None or an int in 1..1024")
    if target is not None and not isinstance(target, str):
        raise ValueError(f"target = {target!r}: must be None or a target name")


def _outputs(q, v, out, return_lse, layout):
    """out (given or new, in `layout`) and the optional LSE [B, Hq, Lq]."""
    b, hq, lq, dv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    if out is None:
        shape = (b, hq, lq, dv) if layout == "bhsd" else (b, lq, hq, dv)
        out = _new_like(q, shape, q.dtype)
    o = _four_d(_describe(out, "out"), "out", layout)
    if not o.writable:
        raise ValueError("out is read-only")
    lse = lse_op = None
    if return_lse:
        lse = _new_like(q, (b, hq, lq), _F32)
        lse_op = _describe(lse, "lse", (_F32,))
        lse_op.shape += (1,)
        lse_op.strides += (1,)
    return out, o, lse, lse_op


def attention(q, k, v, *, out=None, return_lse=False, layout="bhsd", scale=None,
              causal=False, alignment=None, mask=None, kv_lengths=None,
              window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
              dropout_p=0.0, seed=0, threads=None, target=None, k_format=None,
              v_format=None, k_scale=None, v_scale=None, allow_bf16_compute=False):
    """O = softmax(scale * Q K^T + options) V, fused, on the CPU.

    q [B, Hq, Lq, Dk], k [B, Hkv, Lk, Dk], v [B, Hkv, Lk, Dv] in `layout`
    "bhsd" (PyTorch's) or "bshd" ([B, S, H, D], the engines' KV caches):
    NumPy arrays (float32, float16) or PyTorch CPU tensors (also
    bfloat16), any strides with a contiguous last dimension, read in place.
    Hq is a multiple of Hkv (GQA, MQA). K and V may differ in dtype.
    k_format / v_format: "int8", "q8_0", "fp8_e4m3" or "fp8_e5m2" when k / v
    hold a quantized KV cache (uint8 or int8 arrays, as quantize_kv makes
    them; q8_0's last dimension is D / 32 * 34 bytes); k_scale / v_scale:
    int8's per-token float32 scales ([B, Hkv, Lk], or [B, Lk, Hkv] with
    "bshd"), fp8's per-tensor float (default 1).

    out: written in place and returned (same layout, [B, Lq, Hq, Dv] for
    "bshd"); by default a new array of q's kind and dtype. return_lse: also
    return the log-sum-exp of each row, float32 [B, Hq, Lq].
    scale: default 1/sqrt(Dk). causal: hide keys after the query's position
    p(i); alignment: "top-left" (p(i) = i, PyTorch's is_causal) or
    "bottom-right" (p(i) = i + Lk_b - Lq, KV caches), required for causal,
    window and ALiBi whenever Lq != Lk or kv_lengths are given.
    mask: bool (True = attend) or additive float, broadcasting to
    [B, Hq, Lq, Lk] (always that order). kv_lengths: B valid key counts
    (int32 or int64). window: (left, right) FlashAttention 2 sliding window,
    negative = unbounded. softcap: s = c * tanh(s / c) when > 0.
    alibi_slopes, sinks: Hq float32 values each. dropout_p with seed:
    counter-based dropout, the same for every thread count.
    threads: None for the library's pool of all cores, else a pool of that
    many threads. target: cap the code path (a name from info()).
    allow_bf16_compute: let float32/float16 inputs be rounded to bfloat16
    for the products where the CPU has bf16 matrix units (AMX); the result
    is then held to the bf16 bound of SEMANTICS.md.

    Raises ValueError for invalid arguments (the library's message),
    NotImplementedError for valid calls no kernel covers yet, MemoryError,
    RuntimeError; nothing is written then. TypeError for operands that are
    neither arrays nor tensors. The GIL is released during the call.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout = {layout!r}: must be 'bhsd' or 'bshd'")
    if alignment not in _ALIGNMENTS:
        raise ValueError(f"alignment = {alignment!r}: must be None, 'top-left' "
                         "or 'bottom-right'")
    _check_scalars(scale, window, softcap, dropout_p, seed, threads, target)
    qo = _four_d(_describe(q, "q"), "q", layout)
    ko = _four_d(_kv_operand(k, "k", k_format), "k", layout)
    vo = _four_d(_kv_operand(v, "v", v_format), "v", layout)
    mo = _mask(mask)
    slopes, slopes_mem = _vector(alibi_slopes, "alibi_slopes", qo.shape[1], False)
    sink, sink_mem = _vector(sinks, "sinks", qo.shape[1], False)
    lengths, lengths_mem = _vector(kv_lengths, "kv_lengths", qo.shape[0], True)
    result, oo, lse, lse_op = _outputs(qo, vo, out, return_lse, layout)
    options = _simdattn.Options(
        scale is not None, 0.0 if scale is None else float(scale), bool(causal),
        _ALIGNMENTS[alignment], int(window[0]), int(window[1]), float(softcap),
        slopes, sink, lengths, float(dropout_p), int(seed))
    _set_kv_scales(options, k_format, v_format, k_scale, v_scale, ko.shape, vo.shape,
                   layout == "bshd")
    status, message, _, _ = _simdattn.attention(
        qo.as_tuple(), ko.as_tuple(), vo.as_tuple(), oo.as_tuple(),
        None if lse_op is None else lse_op.as_tuple(),
        None if mo is None else mo.as_tuple(), options,
        0 if threads is None else threads, target or "", bool(allow_bf16_compute))
    del slopes_mem, sink_mem, lengths_mem  # held until the call returned
    if status != _simdattn.OK:
        raise _ERRORS.get(status, RuntimeError)(message)
    return (result, lse) if return_lse else result


# ---------------------------------------------------------------- append


def _token_rows(x, name, writable=False):
    """A [tokens, heads, d] operand as the logical [1, heads, tokens, d]."""
    op = _describe(x, name)
    if len(op.shape) != 3:
        raise ValueError(f"{name} has {len(op.shape)} dimensions, shape {op.shape}: "
                         "must be 3-D [tokens, heads, head_dim]")
    if writable and not op.writable:
        raise ValueError(f"{name} is read-only: it is written in place")
    op.user_shape = op.shape
    t, h, d = op.shape
    op.shape = (1, h, t, d)
    op.strides = (0, op.strides[1], op.strides[0], op.strides[2])
    return op


def _paged(x, name, kv_layout, writable=True, fmt=None):
    """A cache [num_blocks, block_size, heads, d] ("NHD") or [num_blocks,
    heads, block_size, d] ("HND") as the logical [num_blocks, heads,
    block_size, d]; in quantized format `fmt` when given."""
    op = _kv_operand(x, name, fmt)
    if len(op.shape) != 4:
        raise ValueError(f"{name} has {len(op.shape)} dimensions, shape {op.shape}: "
                         f"must be 4-D ({kv_layout})")
    if writable and not op.writable:
        raise ValueError(f"{name} is read-only: the new tokens are written into it")
    op.user_shape = op.shape
    if kv_layout == "NHD":
        op.shape = (op.shape[0], op.shape[2], op.shape[1], op.shape[3])
        op.strides = (op.strides[0], op.strides[2], op.strides[1], op.strides[3])
    return op


def _int32_vector(x, name, want):
    """(address, holder) of `want` int32 values. int32 arrays and tensors
    are read in place when contiguous; other integer ones (int64 above all)
    and lists are converted, and every value must fit int32."""
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}: must be on the CPU")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"{name}.dtype = {x.dtype}: must be an integer type")
        if x.dtype != torch.int32:
            if x.numel() and (int(x.min()) < -2**31 or int(x.max()) >= 2**31):
                raise ValueError(f"{name} has values outside the int32 range")
            x = x.to(torch.int32)
        x = x.contiguous()
        shape, address = tuple(x.shape), x.data_ptr()
    elif _is_numpy(x):
        import numpy as np
        if x.dtype.kind not in "iu":
            raise ValueError(f"{name}.dtype = {x.dtype}: must be an integer type")
        if x.dtype != np.int32:
            if x.size and (int(x.min()) < -2**31 or int(x.max()) >= 2**31):
                raise ValueError(f"{name} has values outside the int32 range")
            x = x.astype(np.int32)
        x = np.ascontiguousarray(x)
        shape, address = x.shape, x.__array_interface__["data"][0]
    else:
        try:
            x = _array.array("i", x)
        except (TypeError, OverflowError) as e:
            raise ValueError(f"{name}: {e}") from None
        shape, address = (len(x),), x.buffer_info()[0]
    if len(shape) != 1 or shape[0] != want:
        raise ValueError(f"{name} has shape {shape}: must be (tokens = {want},)")
    return address, x


def _table(x, name):
    """(address, shape, holder) of a float32 [max_position, rotary_dim / 2]
    table; other float dtypes are converted."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}: must be on the CPU")
        if not x.dtype.is_floating_point:
            raise ValueError(f"{name}.dtype = {x.dtype}: must be a float type")
        import torch
        x = x.to(torch.float32).contiguous()
        shape, address = tuple(x.shape), x.data_ptr()
    elif _is_numpy(x):
        import numpy as np
        if x.dtype.kind != "f":
            raise ValueError(f"{name}.dtype = {x.dtype}: must be a float type")
        x = np.ascontiguousarray(x, dtype=np.float32)
        shape, address = x.shape, x.__array_interface__["data"][0]
    else:
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, "
                        f"got {type(x).__name__}")
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"{name} has shape {shape}: must be "
                         "[max_position, rotary_dim / 2], both positive")
    return address, shape, x


def _check_append_shapes(k, v, kc, vc, q):
    """The extents that Python names differently from the library: tokens,
    heads and head dims of the [tokens, heads, d] inputs against each other
    and against the caches' logical [num_blocks, heads, block_size, d]."""
    (t, h, dk), (tv, hv, dv) = k.user_shape, v.user_shape
    if (tv, hv) != (t, h):
        raise ValueError(f"k_new has shape {k.user_shape} and v_new {v.user_shape}: "
                         "they must agree in tokens and heads")
    for name, c, d in (("k_cache", kc, dk), ("v_cache", vc, dv)):
        if c.shape[1] != h or c.shape[3] != d:
            raise ValueError(f"{name} has shape {c.user_shape}: its heads and head_dim "
                             f"must be {h} and {d}, as {name[0]}_new's")
    if kc.shape[0] != vc.shape[0] or kc.shape[2] != vc.shape[2]:
        raise ValueError(f"k_cache has shape {kc.user_shape} and v_cache "
                         f"{vc.user_shape}: they must agree in num_blocks and block_size")
    if q is not None and (q.user_shape[0] != t or q.user_shape[2] != dk):
        raise ValueError(f"q has shape {q.user_shape}: must be [tokens = {t}, Hq, "
                         f"head_dim = {dk}]")


def _rotary(positions, cos, sin, q, tokens, interleaved):
    """The rotary tuple of _simdattn.append_kv and the objects holding its
    memory."""
    if positions is None:
        for name, x in (("cos", cos), ("sin", sin), ("q", q)):
            if x is not None:
                raise ValueError(f"{name} is given without positions: rotary "
                                 "embedding needs positions, cos and sin")
        return (0, 0, 0, 0, 0, False), ()
    if cos is None or sin is None:
        raise ValueError("positions is given without " + ("cos" if cos is None else "sin")
                         + ": rotary embedding needs positions, cos and sin")
    pos, pos_mem = _int32_vector(positions, "positions", tokens)
    cos_addr, shape, cos_mem = _table(cos, "cos")
    sin_addr, sin_shape, sin_mem = _table(sin, "sin")
    if sin_shape != shape:
        raise ValueError(f"sin has shape {sin_shape} but cos has {shape}: they must agree")
    rot = (pos, cos_addr, sin_addr, shape[0], 2 * shape[1], bool(interleaved))
    return rot, (pos_mem, cos_mem, sin_mem)


def _append_scales(fmt, scales, scale, side, nhd):
    """The scale cache operand (int8, written) and per-tensor scale (fp8) of
    one cache of append_kv, and the object holding the scale cache."""
    op = None
    if scales is not None:
        if fmt != "int8":
            raise ValueError(f"{side}_scales is given but {side}_format is "
                             f"{fmt!r}: only an int8 cache has a scale cache")
        op = _describe(scales, f"{side}_scales", (_F32,))
        if not op.writable:
            raise ValueError(f"{side}_scales is read-only: the new tokens' scales "
                             "are written into it")
        if len(op.shape) != 3:
            raise ValueError(f"{side}_scales has shape {op.shape}: must be 3-D, "
                             "[num_blocks, block_size, Hkv] (NHD) or [num_blocks, "
                             "Hkv, block_size] (HND)")
        op.shape += (1,)
        op.strides += (1,)
        if nhd:
            op.shape = (op.shape[0], op.shape[2], op.shape[1], 1)
            op.strides = (op.strides[0], op.strides[2], op.strides[1], 1)
    elif fmt == "int8":
        raise ValueError(f"{side}_format is 'int8': {side}_scales (its scale cache, "
                         "float32, one per slot) is required")
    if scale is not None:
        if fmt not in _FP8_MAX:
            raise ValueError(f"{side}_scale = {scale!r} but {side}_format is {fmt!r}: "
                             "only fp8 caches take a per-tensor scale")
        if not isinstance(scale, (int, float)):
            raise ValueError(f"{side}_scale = {scale!r}: must be a number")
    return (None if op is None else op.as_tuple()), (1.0 if scale is None else float(scale))


def append_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, q=None, positions=None,
              cos=None, sin=None, rotary_interleaved=False, kv_layout="NHD",
              threads=None, k_format=None, v_format=None, k_scales=None,
              v_scales=None, k_scale=None, v_scale=None):
    """Writes new tokens' K and V into a paged KV cache, in place.

    k_new [tokens, Hkv, Dk], v_new [tokens, Hkv, Dv]: NumPy arrays (float32,
    float16) or PyTorch CPU tensors (also bfloat16), any strides with a
    contiguous last dimension (views into a fused QKV buffer work).
    k_cache, v_cache: [num_blocks, block_size, Hkv, D] for kv_layout "NHD"
    (vLLM's) or [num_blocks, Hkv, block_size, D] for "HND", writable, each
    of any of those dtypes (the values are rounded to nearest even);
    block_size is a multiple of 8.
    slot_mapping [tokens]: token t goes to block slot // block_size, row
    slot % block_size; a negative slot skips the token. Integer arrays or a
    list: int32 is read in place, other integer types are converted (every
    value must fit int32).

    Rotary embedding (RoPE) when positions is given: positions [tokens]
    (integers as slot_mapping, each in [0, max_position)), cos and sin
    [max_position, rotary_dim / 2] (float32; other float dtypes are
    converted). K's first rotary_dim dims are rotated before they are
    stored, and so are q's ([tokens, Hq, Dk], writable; every token, those
    with a negative slot too), in place: pairs (2i, 2i + 1) when
    rotary_interleaved (GPT-J), (i, i + rotary_dim / 2) otherwise
    (GPT-NeoX, Llama); (x, y) becomes (x cos - y sin, y cos + x sin).
    threads: None for the library's pool of all cores, else a pool of that
    many threads. Returns None.

    Quantized caches: k_format / v_format "int8", "q8_0", "fp8_e4m3" or
    "fp8_e5m2" with the cache a uint8 or int8 array as quantize_kv makes
    (q8_0: the last dimension D / 32 blocks of 34 bytes). The rows are
    computed in float32 (K rotated) and stored as quantize_kv stores them.
    An int8 cache needs k_scales / v_scales, its float32 scale cache
    [num_blocks, block_size, Hkv] ("NHD") or [num_blocks, Hkv, block_size]
    ("HND"), into which each row's scale max|x| / 127 is written (pass it
    to paged_attention as k_scale / v_scale); an fp8 cache takes
    k_scale / v_scale, its per-tensor scale (default 1; x / scale is
    stored, saturating).

    Raises ValueError for invalid arguments (two tokens on one slot, a slot
    or position out of range, mismatched shapes, a read-only cache, ...;
    nothing is written then), TypeError for operands that are neither
    arrays nor tensors, MemoryError, RuntimeError. The GIL is released
    during the call.
    """
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout = {kv_layout!r}: must be 'NHD' or 'HND'")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 1024):
        raise ValueError(f"threads = {threads!r}: must be None or an int in 1..1024")
    ko = _token_rows(k_new, "k_new")
    vo = _token_rows(v_new, "v_new")
    kc = _paged(k_cache, "k_cache", kv_layout, fmt=k_format)
    vc = _paged(v_cache, "v_cache", kv_layout, fmt=v_format)
    qo = None if q is None else _token_rows(q, "q", writable=True)
    _check_append_shapes(ko, vo, kc, vc, qo)
    nhd = kv_layout == "NHD"
    ks, kv = _append_scales(k_format, k_scales, k_scale, "k", nhd)
    vs, vv = _append_scales(v_format, v_scales, v_scale, "v", nhd)
    tokens = ko.user_shape[0]
    slots, slots_mem = _int32_vector(slot_mapping, "slot_mapping", tokens)
    rot, rot_mem = _rotary(positions, cos, sin, q, tokens, rotary_interleaved)
    status, message = _simdattn.append_kv(
        ko.as_tuple(), vo.as_tuple(), kc.as_tuple(), vc.as_tuple(), slots,
        None if qo is None else qo.as_tuple(), rot, (ks, vs, kv, vv),
        0 if threads is None else threads)
    del slots_mem, rot_mem  # held until the call returned
    if status != _simdattn.OK:
        raise _ERRORS.get(status, RuntimeError)(message)


# ---------------------------------------------------------------- paged


def _int32_rows(x, name, ndim):
    """x as a contiguous int32 array of `ndim` dimensions (NumPy or torch;
    other integer types are converted): (address, shape, holder)."""
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}: must be on the CPU")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"{name}.dtype = {x.dtype}: must be an integer type")
        x = x.to(torch.int32).contiguous()
        shape, address = tuple(x.shape), x.data_ptr()
    else:
        import numpy as np
        x = np.asarray(x)
        if x.dtype.kind not in "iu":
            raise ValueError(f"{name}.dtype = {x.dtype}: must be an integer type")
        if x.size and (x.min() < -2**31 or x.max() >= 2**31):
            raise ValueError(f"{name}: values outside the int32 range")
        x = np.ascontiguousarray(x, dtype=np.int32)
        shape, address = x.shape, x.__array_interface__["data"][0]
    if len(shape) != ndim:
        raise ValueError(f"{name} has shape {tuple(shape)}: must have {ndim} "
                         f"dimension{'s' if ndim > 1 else ''}")
    return address, tuple(shape), x


def paged_attention(q, k_cache, v_cache, block_table, kv_lens, *, cu_seqlens_q=None,
                    out=None, return_lse=False, scale=None, causal=True,
                    window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                    dropout_p=0.0, seed=0, kv_layout="NHD", threads=None,
                    target=None, k_format=None, v_format=None, k_scale=None,
                    v_scale=None):
    """Attention of a ragged batch of sequences against a paged KV cache.

    q [total_q, Hq, Dk]: the queries of every sequence, sequence s owning
    rows cu_seqlens_q[s]:cu_seqlens_q[s + 1] (its last tokens); by default
    (cu_seqlens_q None) one query per sequence. k_cache / v_cache
    [num_blocks, block_size, Hkv, D] (kv_layout "NHD", vLLM's) or
    [num_blocks, Hkv, block_size, D] ("HND"), block_size a multiple of 8.
    block_table [num_seqs, max_blocks_per_seq] and kv_lens [num_seqs]:
    key j of sequence s is row j % block_size of page
    block_table[s, j // block_size], for j < kv_lens[s]. Integer arrays are
    read as int32.

    Returns out [total_q, Hq, Dv] (or writes the given `out`), and with
    return_lse the natural-log LSE of each row, float32 [Hq, total_q].
    causal is bottom-right per sequence (query i of a sequence with Lq
    queries and Lk keys sees keys j <= i + Lk - Lq); scale, window,
    softcap, alibi_slopes, sinks, dropout_p and seed are attention()'s,
    per sequence (dropout's batch index is the sequence's). A sequence
    without keys gives zeros (LSE -inf, or its sink). Errors as attention().
    k_format, v_format, k_scale, v_scale: quantized caches as attention()
    takes them; int8's scales are [num_blocks, block_size, Hkv] ("NHD")
    or [num_blocks, Hkv, block_size] ("HND"), one per slot.
    """
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout = {kv_layout!r}: must be 'NHD' or 'HND'")
    _check_scalars(scale, window, softcap, dropout_p, seed, threads, target)
    qo = _token_rows(q, "q")
    ko = _paged(k_cache, "k_cache", kv_layout, writable=False, fmt=k_format)
    vo = _paged(v_cache, "v_cache", kv_layout, writable=False, fmt=v_format)
    table, table_shape, table_mem = _int32_rows(block_table, "block_table", 2)
    lens, lens_shape, lens_mem = _int32_rows(kv_lens, "kv_lens", 1)
    num_seqs = lens_shape[0]
    if table_shape[0] != num_seqs:
        raise ValueError(f"block_table has {table_shape[0]} rows: must have one "
                         f"per sequence (kv_lens has {num_seqs})")
    cu, cu_mem = 0, None
    if cu_seqlens_q is not None:
        cu, cu_shape, cu_mem = _int32_rows(cu_seqlens_q, "cu_seqlens_q", 1)
        if cu_shape[0] != num_seqs + 1:
            raise ValueError(f"cu_seqlens_q has {cu_shape[0]} entries: must have "
                             f"num_seqs + 1 = {num_seqs + 1}")
    total_q, hq = qo.shape[2], qo.shape[1]
    slopes, slopes_mem = _vector(alibi_slopes, "alibi_slopes", hq, False)
    sink, sink_mem = _vector(sinks, "sinks", hq, False)
    if out is None:
        out = _new_like(qo, (total_q, hq, vo.shape[3]), qo.dtype)
    oo = _token_rows(out, "out", writable=True)
    lse = lse_op = None
    if return_lse:
        lse = _new_like(qo, (hq, total_q), _F32)
        lse_op = _describe(lse, "lse", (_F32,))
        lse_op.shape = (1,) + lse_op.shape + (1,)
        lse_op.strides = (0,) + lse_op.strides + (1,)
    options = _simdattn.Options(
        scale is not None, 0.0 if scale is None else float(scale), bool(causal),
        _ALIGNMENTS["bottom-right"], int(window[0]), int(window[1]), float(softcap),
        slopes, sink, (0, 0, _I64), float(dropout_p), int(seed))
    _set_kv_scales(options, k_format, v_format, k_scale, v_scale, ko.shape, vo.shape,
                   kv_layout == "NHD")
    arrays = _simdattn.PagedArrays(table, table_shape[1], table_shape[1], lens,
                                   num_seqs, cu)
    status, message, _, _ = _simdattn.paged_attention(
        qo.as_tuple(), ko.as_tuple(), vo.as_tuple(), oo.as_tuple(),
        None if lse_op is None else lse_op.as_tuple(), arrays, options,
        0 if threads is None else threads, target or "")
    del slopes_mem, sink_mem, table_mem, lens_mem, cu_mem
    if status != _simdattn.OK:
        raise _ERRORS.get(status, RuntimeError)(message)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------- merge


def _lse_operand(x, name, shape):
    """An LSE [B, H, L] or [B, H, L, 1] (float32) as the 4-D [B, H, L, 1]."""
    op = _describe(x, name, (_F32,))
    if len(op.shape) == 3:
        op.shape += (1,)
        op.strides += (1,)
    if op.shape != tuple(shape[:3]) + (1,):
        raise ValueError(f"{name} has shape {tuple(x.shape)}: must be [B, H, L] or "
                         f"[B, H, L, 1] = {list(shape[:3])} (outs[0] is {list(shape)})")
    return op


def merge_states(outs, lses, *, out=None, threads=None):
    """Merges attention results over disjoint sets of keys into what one call
    over all the keys gives (docs/SEMANTICS.md "Merging partial results").

    outs: a list of parts [B, H, L, Dv] as attention() returns them with
    layout="bhsd" (float32, float16, bfloat16 for torch; the dtypes may
    differ); lses: their log-sum-exps, float32 [B, H, L] as
    attention(return_lse=True) returns them (or [B, H, L, 1]). Returns
    (out, lse): lse = log(sum_i exp(lses[i])) float32 [B, H, L], and
    out = sum_i exp(lses[i] - lse) * outs[i], written into `out` when given
    (it may be outs[0] itself), else a new array of outs[0]'s kind and
    dtype. A part whose LSE is -inf (it saw no key) adds nothing; a row no
    part saw gives zeros and -inf; a NaN LSE gives a NaN row, +inf out NaN
    and lse +inf. threads: None for the library's pool, else a pool of that
    many threads.

    Raises ValueError for invalid arguments (the library's message names
    them; nothing is written), TypeError for operands that are not arrays.
    The GIL is released during the call.
    """
    if isinstance(outs, (str, bytes)) or not hasattr(outs, "__len__"):
        raise ValueError(f"outs must be a list of arrays, got {type(outs).__name__}")
    if isinstance(lses, (str, bytes)) or not hasattr(lses, "__len__"):
        raise ValueError(f"lses must be a list of arrays, got {type(lses).__name__}")
    if len(outs) == 0:
        raise ValueError("outs is empty: merge_states needs at least one part")
    if len(lses) != len(outs):
        raise ValueError(f"len(lses) = {len(lses)} but len(outs) = {len(outs)}: "
                         "one LSE per part")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 1024):
        raise ValueError(f"threads = {threads!r}: must be None or an int in 1..1024")
    parts = [_four_d(_describe(o, f"outs[{i}]"), f"outs[{i}]", "bhsd")
             for i, o in enumerate(outs)]
    shape = parts[0].shape
    lse_ops = [_lse_operand(x, f"lses[{i}]", shape) for i, x in enumerate(lses)]
    if out is None:
        out = _new_like(parts[0], shape, parts[0].dtype)
    o = _four_d(_describe(out, "out"), "out", "bhsd")
    if not o.writable:
        raise ValueError("out is read-only")
    lse = _new_like(parts[0], shape[:3], _F32)
    lse_op = _lse_operand(lse, "lse", shape)
    status, message = _simdattn.merge_states(
        [p.as_tuple() for p in parts], [x.as_tuple() for x in lse_ops],
        o.as_tuple(), lse_op.as_tuple(), 0 if threads is None else threads)
    if status != _simdattn.OK:
        raise _ERRORS.get(status, RuntimeError)(message)
    return out, lse


# ---------------------------------------------------------------- quantize


def quantize_kv(x, fmt, *, scale=None):
    """x (float32, float16, or bfloat16 for torch; [..., D], at most 4-D)
    stored in quantized format `fmt` for a KV cache, round to nearest even
    (SEMANTICS.md "Quantized KV caches"). Returns (data, scales), data uint8
    of x's kind:
      "int8":  data [..., D] (int8 bit patterns), scales float32 [...]: one
               per row, max|x| / 127;
      "q8_0":  data [..., D / 32 * 34]: blocks of an f16 scale and 32 int8
               (D a multiple of 32), scales None;
      "fp8_e4m3", "fp8_e5m2": data [..., D], scales the float per-tensor
               scale: `scale`, or by default max|x| / 448 (57344), 1 for
               an all-zero or non-finite x; values beyond the largest
               saturate.
    Pass data and scales to attention()/paged_attention() with the format.
    """
    if fmt not in _FORMATS:
        raise ValueError(f"fmt = {fmt!r}: must be one of {', '.join(_FORMATS)}")
    op = _describe(x, "x")
    nd = len(op.shape)
    if not 1 <= nd <= 4:
        raise ValueError(f"x has {nd} dimensions, shape {op.shape}: must be 1-D to 4-D")
    lead = op.shape[:-1]
    d = op.shape[-1]
    if fmt == "q8_0" and d % 32 != 0:
        raise ValueError(f"x.shape[-1] = {d}: q8_0 needs a multiple of 32")
    row = d // 32 * 34 if fmt == "q8_0" else d
    if op.torch_kind:
        import torch
        data = torch.empty(lead + (row,), dtype=torch.uint8)
        scales = torch.empty(lead, dtype=torch.float32) if fmt == "int8" else None
    else:
        import numpy as np
        data = np.empty(lead + (row,), dtype=np.uint8)
        scales = np.empty(lead, dtype=np.float32) if fmt == "int8" else None
    value = 1.0
    if fmt in _FP8_MAX:
        if scale is None:
            amax = float(abs(x).max()) if op.shape and all(op.shape) else 0.0
            value = amax / _FP8_MAX[fmt] if _math.isfinite(amax) and amax > 0 else 1.0
        elif isinstance(scale, (int, float)):
            value = float(scale)
        else:
            raise ValueError(f"scale = {scale!r}: must be None or a number")
    elif scale is not None:
        raise ValueError(f"scale = {scale!r}: only fp8 formats take a scale")
    pad = 4 - nd
    op.shape = (1,) * pad + op.shape
    op.strides = (0,) * pad + op.strides
    out = _Operand(_address(data), _FORMATS[fmt], op.shape[:3] + (d,),
                   _contiguous_strides(op.shape[:3] + (row,)), op.torch_kind, True)
    sc = None
    if scales is not None:
        sc = _Operand(_address(scales), _F32, op.shape[:3] + (1,),
                      _contiguous_strides(op.shape[:3] + (1,)), op.torch_kind, True)
    status, message = _simdattn.quantize_kv(op.as_tuple(), out.as_tuple(),
                                            None if sc is None else sc.as_tuple(),
                                            value if fmt in _FP8_MAX else 1.0)
    if status != _simdattn.OK:
        raise _ERRORS.get(status, RuntimeError)(message)
    if fmt in _FP8_MAX:
        return data, value
    return data, scales


def _address(x):
    return x.data_ptr() if _is_torch(x) else x.__array_interface__["data"][0]


def _contiguous_strides(shape):
    strides, n = [], 1
    for extent in reversed(shape):
        strides.append(n)
        n *= extent
    return tuple(reversed(strides))


# ------------------------------------------------ multi-head attention layer

from . import _simdattn_mha

__all__ += ["MultiheadAttention"]

_DTYPE_NAMES = {"f32": _F32, "float32": _F32, "f16": _F16, "float16": _F16,
                "bf16": _BF16, "bfloat16": _BF16}


def _contiguous(x, name, allowed=(_F32, _F16, _BF16)):
    """x as a dense row-major operand (a copy when it is not), with the
    object that owns its memory."""
    if _is_torch(x):
        x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()
    elif _is_numpy(x):
        import numpy as np
        x = np.ascontiguousarray(x)
    return _describe(x, name, allowed), x


def _new_array(like, shape, torch_out):
    if torch_out:
        import torch
        return torch.empty(shape, dtype=like.dtype)
    import numpy as np
    return np.empty(shape, dtype=like.dtype)


class MultiheadAttention:
    """Multi-head attention with learned projections, like PyTorch's
    nn.MultiheadAttention (plus num_kv_heads for GQA/MQA and head_dim):

        out = concat_heads(attention(q Wq^T + bq, k Wk^T + bk, v Wv^T + bv)) Wo^T + bo

    Weights come from load_state_dict() under PyTorch names (in_proj_weight,
    in_proj_bias, q/k/v_proj_weight, out_proj.weight, out_proj.bias, bias_k,
    bias_v) or Llama names (q_proj.weight ... o_proj.weight), as NumPy
    arrays or torch tensors, and are packed once.

    Masks follow PyTorch, NOT simdattn.attention(): a bool key_padding_mask
    [B, S] or attn_mask [L, S] / [B * num_heads, L, S] is True where a key
    is masked OUT; float masks are added to the scores. A row whose keys
    are all masked outputs zeros (PyTorch gives NaN there). need_weights
    returns the softmax weights, recomputed after the fused kernel from its
    log-sum-exp. Extra keyword arguments of __call__ (scale, softcap,
    window, alibi_slopes, sinks, dropout_p, seed, alignment) are those of
    simdattn.attention(). target (a name from simdattn.info()) caps the
    code path of the weights' packing and of every call.
    """

    def __init__(self, embed_dim, num_heads, *, num_kv_heads=None, kdim=None, vdim=None,
                 bias=True, add_bias_kv=False, batch_first=True, dtype="f32",
                 head_dim=None, threads=None, target=None):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype = {dtype!r}: must be one of f32, f16, bf16")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.batch_first, self.threads = batch_first, threads or 0
        self.target = target or ""  # caps the code path of loading and every call
        self._layer = 0
        self._add_bias_kv = bool(add_bias_kv)
        status, message, layer = _simdattn_mha.create(
            embed_dim, num_heads, num_kv_heads or 0, head_dim or 0, kdim or 0, vdim or 0,
            bool(bias), bool(add_bias_kv), _DTYPE_NAMES[dtype])
        if status:
            raise _ERRORS[status](message)
        self._layer = layer

    def __del__(self):
        if getattr(self, "_layer", 0):
            _simdattn_mha.destroy(self._layer)
            self._layer = 0

    def load_state_dict(self, state_dict):
        """Loads every weight from a mapping of names to arrays or tensors."""
        keep, tensors = [], []
        for name, value in state_dict.items():
            op, owner = _contiguous(value, name)
            keep.append(owner)
            tensors.append((str(name), op.address, op.dtype, list(op.shape)))
        status, message = _simdattn_mha.load(self._layer, tensors, self.threads, self.target)
        if status:
            raise _ERRORS[status](message)
        return self

    def _act(self, x, name, unbatched):
        op, owner = _contiguous(x, name)
        shape = op.shape if not unbatched else ((1,) + op.shape if self.batch_first
                                                else (op.shape[0], 1, op.shape[1]))
        if len(shape) != 3:
            raise ValueError(f"{name}: shape {tuple(op.shape)}, want 3-D (or 2-D unbatched)")
        b, l = (shape[0], shape[1]) if self.batch_first else (shape[1], shape[0])
        return (op.address, op.dtype, self.batch_first, b, l, shape[2]), owner

    @staticmethod
    def _mask(m, name, keep):
        if m is None:
            return (0, _BOOL, [])
        op, owner = _contiguous(m, name, (_F32, _BOOL))
        keep.append(owner)
        return (op.address, op.dtype, list(op.shape))

    def __call__(self, query, key=None, value=None, *, key_padding_mask=None, attn_mask=None,
                 is_causal=False, need_weights=False, average_attn_weights=True, scale=None,
                 softcap=0.0, window=(-1, -1), alibi_slopes=None, sinks=None, dropout_p=0.0,
                 seed=0, alignment=None):
        unbatched = len(query.shape) == 2
        if (key is None) != (value is None):
            raise ValueError("key and value: give both or neither")
        keep = []
        q, owner = self._act(query, "query", unbatched)
        keep.append(owner)
        k = v = (0, _F32, True, 0, 0, 0)
        if key is not None:
            k, owner_k = self._act(key, "key", unbatched)
            v, owner_v = self._act(value, "value", unbatched)
            keep += [owner_k, owner_v]
        if unbatched and key_padding_mask is not None and len(key_padding_mask.shape) == 1:
            key_padding_mask = key_padding_mask.reshape(1, -1)
        kpm = self._mask(key_padding_mask, "key_padding_mask", keep)
        am = self._mask(attn_mask, "attn_mask", keep)
        b, lq = q[3], q[4]
        lk = (k[4] if key is not None else lq) + (1 if self._has_bias_kv() else 0)
        out = _new_array(owner, tuple(owner.shape), _is_torch(owner))
        o = self._act(out, "out", unbatched)[0]
        weights = None
        import numpy as np
        if need_weights:
            wshape = (b, lq, lk) if average_attn_weights else (b, self.num_heads, lq, lk)
            weights = np.empty(wshape, dtype=np.float32)
        arrays = [np.ascontiguousarray(a, dtype="float32") if a is not None else None
                  for a in (alibi_slopes, sinks)] if (alibi_slopes is not None or sinks is not None) else [None, None]
        if alignment is None and is_causal:
            alignment = "top-left"  # PyTorch's is_causal
        attn = (scale is not None, float(scale or 0.0), bool(is_causal),
                _ALIGNMENTS[alignment] if alignment is not None else -1, int(window[0]),
                int(window[1]), float(softcap),
                arrays[0].__array_interface__["data"][0] if arrays[0] is not None else 0,
                arrays[1].__array_interface__["data"][0] if arrays[1] is not None else 0,
                self.num_heads, float(dropout_p), int(seed))
        waddr = weights.__array_interface__["data"][0] if weights is not None else 0
        status, message, _ = _simdattn_mha.forward(self._layer, q, k, v, o, kpm, am, attn,
                                                   waddr, bool(average_attn_weights),
                                                   self.threads, self.target)
        if status:
            raise _ERRORS[status](message)
        if weights is not None:
            if unbatched:
                weights = weights[0]
            if _is_torch(owner):
                import torch
                weights = torch.from_numpy(weights)
        return out, weights

    @staticmethod
    def _in_place(a, name, allowed):
        """a's description, a being a dense array the call writes in place."""
        op, owner = _contiguous(a, name, allowed)
        if owner is not a and not (_is_torch(a) and owner.data_ptr() == a.data_ptr()):
            raise ValueError(f"{name}: must be a contiguous array (it is written in place)")
        if not op.writable:
            raise ValueError(f"{name}: must be writable (it is written in place)")
        return op

    @staticmethod
    def _int32(a, name, in_place):
        """(address, shape, owner) of an int32 array (a contiguous copy
        unless in_place, when a itself must be contiguous and writable)."""
        import numpy as np
        if _is_torch(a):
            import torch
            if a.dtype != torch.int32 or a.device.type != "cpu":
                raise ValueError(f"{name}: want an int32 CPU tensor, got {a.dtype}")
            if not a.is_contiguous():
                if in_place:
                    raise ValueError(f"{name}: must be contiguous (it is written in place)")
                a = a.contiguous()
            return a.data_ptr(), tuple(a.shape), a
        if not _is_numpy(a) or a.dtype != np.int32:
            raise ValueError(f"{name}: want an int32 array, got "
                             f"{getattr(a, 'dtype', type(a).__name__)}")
        if in_place and not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError(f"{name}: must be contiguous and writable (it is written in place)")
        a = np.ascontiguousarray(a)
        return a.__array_interface__["data"][0], a.shape, a

    def step_paged(self, x, k_cache, v_cache, block_table, seq_lens, *, layout="nhd",
                   rotary_dim=None, interleaved=False, rope_theta=None, cos=None, sin=None,
                   scale=None, softcap=0.0, window=(-1, -1)):
        """One decoding step on a paged KV cache (a serving engine's decoder
        layer): x [B, T, E] (batch_first; T must be 1 otherwise) holds entry
        b's tokens at positions seq_lens[b] .. seq_lens[b] + T - 1. Their K
        and V, rotated by RoPE when rope_theta or cos/sin are given (Q too;
        rotary_dim defaults to head_dim, interleaved selects GPT-J pairs,
        cos/sin [max_position, rotary_dim / 2] f32 tables), are written to
        the pages k_cache, v_cache ([num_blocks, block_size, Hkv, D] for
        layout "nhd", [num_blocks, Hkv, block_size, D] for "hnd"; written in
        place) at block_table[b] (int32 [B, max_blocks]); each entry
        attends causally over its seq_lens[b] + T keys, and seq_lens (int32
        [B], in place) advances by T. Returns out like x."""
        import numpy as np
        if layout not in ("nhd", "hnd"):
            raise ValueError(f"layout = {layout!r}: want 'nhd' or 'hnd'")
        xo, owner = self._act(x, "x", False)
        kc = self._in_place(k_cache, "k_cache", (_F32, _F16, _BF16))
        vc = self._in_place(v_cache, "v_cache", (_F32, _F16, _BF16))
        sl_address, sl_shape, _ = self._int32(seq_lens, "seq_lens", True)
        bt_address, bt_shape, bt_owner = self._int32(block_table, "block_table", False)
        if sl_shape != (xo[3],):
            raise ValueError(f"seq_lens: shape {sl_shape}, want ({xo[3]},)")

        def pages(op, name):
            if len(op.shape) != 4:
                raise ValueError(f"{name}: shape {tuple(op.shape)}, want 4-D")
            n, a, b, d = op.shape
            return (op.address, op.dtype, layout == "hnd", n, b if layout == "hnd" else a,
                    a if layout == "hnd" else b, d)
        if len(bt_shape) != 2 or bt_shape[0] != xo[3]:
            raise ValueError(f"block_table: shape {bt_shape}, want [{xo[3]}, max_blocks]")
        keep = [bt_owner]
        tables = [None, None]
        if cos is not None or sin is not None:
            tables = [np.ascontiguousarray(t, dtype="float32") for t in (cos, sin)]
            keep += tables
        enabled = rope_theta is not None or cos is not None
        rope = (enabled, int(rotary_dim or 0), bool(interleaved),
                tables[0].__array_interface__["data"][0] if tables[0] is not None else 0,
                tables[1].__array_interface__["data"][0] if tables[1] is not None else 0,
                int(tables[0].shape[0]) if tables[0] is not None else 0,
                float(rope_theta or 10000.0))
        out = _new_array(owner, tuple(owner.shape), _is_torch(owner))
        o = self._act(out, "out", False)[0]
        attn = (scale is not None, float(scale or 0.0), True, -1, int(window[0]), int(window[1]),
                float(softcap), 0, 0, self.num_heads, 0.0, 0)
        status, message, _ = _simdattn_mha.step_paged(
            self._layer, xo, pages(kc, "k_cache"), pages(vc, "v_cache"),
            (bt_address, int(bt_shape[1])), sl_address, rope, o, attn, self.threads,
            self.target)
        if status:
            raise _ERRORS[status](message)
        return out

    def _has_bias_kv(self):
        return getattr(self, "_add_bias_kv", False)
