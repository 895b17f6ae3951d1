"""Errors: the library's invalid arguments raise ValueError with its
message, unimplemented calls NotImplementedError, operands that are not
arrays TypeError; the lengths of slopes, sinks and kv lengths are checked
against the shapes; nothing is written on error; nothing Python can build
crashes the call."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import simdattn
from conftest import random


def inputs(kind="numpy", lq=5, lk=7):
    return (random((2, 4, lq, 8), "f32", kind, 1), random((2, 2, lk, 8), "f32", kind, 2),
            random((2, 2, lk, 8), "f32", kind, 3))


def expect_value_error(needle, *args, **kwargs):
    q, k, v = args if args else inputs()
    out = np.full((2, 4, q.shape[2], v.shape[3]), 7.0, np.float32)
    with pytest.raises(ValueError, match=needle):
        simdattn.attention(q, k, v, out=out, **kwargs)
    assert np.all(out == 7.0), "an invalid call wrote out"


def test_library_errors_are_value_errors_with_its_message():
    q, k, v = inputs()
    expect_value_error(r"alignment is unset, but causal", causal=True)
    expect_value_error(r"alignment is unset, but window_left", window=(3, -1))
    expect_value_error(r"alignment is unset, but alibi_slopes", alibi_slopes=[1, 2, 3, 4])
    expect_value_error(r"Hq = 4 is not a multiple of Hkv = 3",
                       q, random((2, 3, 7, 8)), random((2, 3, 7, 8)))
    expect_value_error(r"head dim mismatch", q, random((2, 2, 7, 4)), v)
    expect_value_error(r"scale = -1", scale=-1.0)
    expect_value_error(r"softcap = -2", softcap=-2.0)
    expect_value_error(r"dropout_p = 1", dropout_p=1.0)
    expect_value_error(r"kv_lengths\[1\] = 8", kv_lengths=[7, 8])
    expect_value_error(r"mask.shape\[3\] = 6 cannot broadcast", mask=np.ones((5, 6), bool))
    expect_value_error(r"max_target = 'AVX9000'", target="AVX9000")
    with pytest.raises(ValueError, match=r"o overlaps input q"):
        simdattn.attention(q, k, v, out=q)


def test_lengths_of_option_arrays_are_checked():
    expect_value_error(r"alibi_slopes has shape \(3,\): must be \(Hq = 4,\)",
                       alibi_slopes=[1.0, 2.0, 3.0], alignment="top-left")
    expect_value_error(r"sinks has shape \(5,\): must be \(Hq = 4,\)", sinks=np.zeros(5))
    expect_value_error(r"kv_lengths has shape \(1,\): must be \(B = 2,\)", kv_lengths=[7])
    expect_value_error(r"kv_lengths has shape \(2, 1\)", kv_lengths=np.array([[7], [7]]))
    expect_value_error(r"kv_lengths: ", kv_lengths=[7, "x"])
    expect_value_error(r"kv_lengths.dtype = float64: must be an integer",
                       kv_lengths=np.array([7.0, 6.5]))
    expect_value_error(r"kv_lengths.dtype = torch.float32: must be an integer",
                       kv_lengths=torch.tensor([7.0, 6.5]))


def test_python_side_checks():
    q, k, v = inputs()
    expect_value_error(r"layout = 'sbhd'", layout="sbhd")
    expect_value_error(r"alignment = 'left'", alignment="left")
    expect_value_error(r"window = \(1,\)", window=(1,))
    expect_value_error(r"seed = -1", seed=-1)
    expect_value_error(r"seed = 18446744073709551616", seed=2**64)
    expect_value_error(r"threads = 0", threads=0)
    expect_value_error(r"scale = nan", scale=float("nan"))
    expect_value_error(r"q has 3 dimensions", q[0], k, v)
    expect_value_error(r"q.dtype = float64", q.astype(np.float64), k, v)
    expect_value_error(r"k.dtype = >f4", q, k.astype(">f4"), v)
    expect_value_error(r"mask.dtype = int64", mask=np.ones((5, 7), np.int64))
    with pytest.raises(ValueError, match="out is read-only"):
        out = np.zeros((2, 4, 5, 8), np.float32)
        out.flags.writeable = False
        simdattn.attention(q, k, v, out=out)
    with pytest.raises(ValueError, match=r"o.shape \[2, 4, 5, 9\]"):
        simdattn.attention(q, k, v, out=np.zeros((2, 4, 5, 9), np.float32))
    odd = np.lib.stride_tricks.as_strided(q, strides=(642, 160, 32, 4))
    with pytest.raises(ValueError, match=r"strides = \(642, .* multiples of the item size 4"):
        simdattn.attention(odd, k, v)


def test_torch_specific_errors():
    q, k, v = inputs("torch")
    with pytest.raises(ValueError, match=r"q.dtype = torch.float64"):
        simdattn.attention(q.double(), k, v)
    with pytest.raises(ValueError, match=r"must be strided"):
        simdattn.attention(q.to_sparse(), k, v)
    with pytest.raises(ValueError, match=r"the last dimension must be contiguous"):
        simdattn.attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)


def test_non_arrays_are_type_errors():
    q, k, v = inputs()
    with pytest.raises(TypeError, match="q must be a NumPy array or a torch tensor, got list"):
        simdattn.attention(q.tolist(), k, v)


def test_unimplemented_is_not_implemented_error():
    q = random((1, 1, 2, 1025))
    with pytest.raises(NotImplementedError, match="1024"):
        simdattn.attention(q, q, q)


def test_status_codes_map_to_python_exceptions():
    # MemoryError and RuntimeError cannot be provoked with small inputs;
    # the mapping the package applies to the library's codes is checked.
    errors = simdattn._ERRORS
    assert errors[simdattn._simdattn.INVALID_ARGUMENT] is ValueError
    assert errors[simdattn._simdattn.UNIMPLEMENTED] is NotImplementedError
    assert errors[simdattn._simdattn.OUT_OF_MEMORY] is MemoryError
    assert errors[simdattn._simdattn.INTERNAL] is RuntimeError


@pytest.mark.parametrize("shape", [(0, 1, 1, 8), (1, 0, 1, 8), (1, 1, 0, 8), (1, 1, 1, 0)])
def test_empty_extents_are_value_errors(shape):
    x = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match="extents must be positive"):
        simdattn.attention(x, x, x)


def test_bad_max_target_environment_is_reported_once():
    code = ("import simdattn, numpy as np\n"
            "print(simdattn.info()['max_target_error'] is not None)\n"
            "q = np.ones((1, 1, 2, 4), np.float32)\n"
            "try:\n    simdattn.attention(q, q, q)\nexcept ValueError as e:\n"
            "    print('first:', e)\n"
            "simdattn.attention(q, q, q)\nprint('second: ok')\n")
    env = dict(os.environ, SIMDATTN_MAX_TARGET="NOT_A_TARGET")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, check=True)
    lines = r.stdout.splitlines()
    assert lines[0] == "True"
    assert lines[1].startswith("first: SIMDATTN_MAX_TARGET = 'NOT_A_TARGET' names no target")
    assert lines[2] == "second: ok"
