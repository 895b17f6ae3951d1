// Argument checking of MergeStates (SEMANTICS.md "Bad input", "Merging
// partial results"): shapes, types, pointers, strides, int64 offsets and
// overlaps, each error naming the argument and its value.

#include "lib/merge_validate.h"

#include <cstdint>
#include <sstream>
#include <string>

#include "lib/status.h"
#include "lib/validate.h"

namespace simdattn {
namespace {

const char* const kDimNames[4] = {"B", "H", "L", "Dv"};

// "outs[2]", "lse", ...
std::string Name(const char* array, int64_t i) {
  return i < 0 ? std::string(array) : std::string(array) + "[" + std::to_string(i) + "]";
}

const char* DTypeText(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 ||
                 t == DType::kBool
             ? DTypeName(t)
             : "unknown";
}

// The extents of one view: all positive when `want` is null (outs[0]), else
// equal to want (outs[0]'s extents, with 1 for an LSE's last one).
Status CheckExtents(const std::string& name, const int64_t* shape,
                    const int64_t* want, bool is_lse) {
  for (int i = 0; i < 4; ++i) {
    std::ostringstream os;
    os << name << ".shape[" << i << "]";
    if (i < 3 || !is_lse) os << " (" << kDimNames[i] << ")";
    os << " = " << shape[i];
    if (want == nullptr && shape[i] <= 0) {
      os << ": extents must be positive";
      return Invalid(os.str());
    }
    if (want != nullptr && shape[i] != want[i]) {
      if (i == 3 && is_lse) {
        os << ": must be 1";
      } else {
        os << ": must equal outs[0].shape[" << i << "] = " << want[i];
      }
      return Invalid(os.str());
    }
  }
  return Status::Ok();
}

// One view alone: dtype, extents, data, unit last stride (an LSE's last
// extent is 1, its stride is not read), no int64 overflow.
Status CheckView(const std::string& name, const TensorView& v,
                 const int64_t* want, bool is_lse, ByteRange* range) {
  if (is_lse ? v.dtype != DType::kF32 : !IsStorageType(v.dtype)) {
    return Invalid(name + ".dtype = " + DTypeText(v.dtype) + ": must be " +
                   (is_lse ? "f32" : "f32, f16 or bf16"));
  }
  Status s = CheckExtents(name, v.shape, want, is_lse);
  if (!s.ok()) return s;
  if (v.data == nullptr) {
    return Invalid(name + ".data is null with shape " + ShapeString(v.shape));
  }
  if (!is_lse && v.strides[3] != 1) {
    return Invalid(name + ".strides[3] = " + std::to_string(v.strides[3]) +
                   ": the last dimension must be contiguous (stride 1)");
  }
  int64_t count = 1;
  for (int i = 0; i < 4; ++i) {
    if (__builtin_mul_overflow(count, v.shape[i], &count)) {
      return Invalid(name + ".shape " + ShapeString(v.shape) +
                     ": element count overflows int64");
    }
  }
  if (!ComputeRange(v.data, v.dtype, v.shape, v.strides, range)) {
    return Invalid(name + ": offsets of shape " + ShapeString(v.shape) +
                   " with its strides overflow int64");
  }
  return Status::Ok();
}

// Whether two views of one shape address the same elements in the same
// way: same data and dtype, same strides wherever the extent exceeds 1.
bool SameView(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype) return false;
  for (int i = 0; i < 4; ++i) {
    if (a.shape[i] > 1 && a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

// The parts: every outs[i] and lses[i] alone and against outs[0].
Status CheckParts(const TensorView* outs, const TensorView* lses,
                  int64_t num_parts) {
  if (num_parts < 1) {
    return Invalid("num_parts = " + std::to_string(num_parts) + ": must be >= 1");
  }
  if (outs == nullptr) {
    return Invalid("outs is null with num_parts = " + std::to_string(num_parts));
  }
  if (lses == nullptr) {
    return Invalid("lses is null with num_parts = " + std::to_string(num_parts));
  }
  ByteRange r;
  Status s = CheckView(Name("outs", 0), outs[0], nullptr, false, &r);
  if (!s.ok()) return s;
  const int64_t* want = outs[0].shape;
  const int64_t want_lse[4] = {want[0], want[1], want[2], 1};
  for (int64_t i = 0; i < num_parts; ++i) {
    if (i > 0) s = CheckView(Name("outs", i), outs[i], want, false, &r);
    if (!s.ok()) return s;
    s = CheckView(Name("lses", i), lses[i], want_lse, true, &r);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// An output view alone: as a part, and no two elements at one address.
Status CheckOutput(const std::string& name, const TensorView& v,
                   const int64_t* want, bool is_lse, ByteRange* range) {
  const Status s = CheckView(name, v, want, is_lse, range);
  if (!s.ok()) return s;
  if (SelfOverlaps(v.shape, v.strides)) {
    return Invalid(name + ".strides make distinct elements of " + name +
                   " share memory");
  }
  return Status::Ok();
}

// Output `name` (`bytes`) against every input, except outs[0] when
// out_is_alias and lses[0] when lse_is_alias (the output is that view).
Status CheckAgainstInputs(const std::string& name, const ByteSet& bytes,
                          const TensorView* outs, const TensorView* lses,
                          int64_t num_parts, bool out_is_alias,
                          bool lse_is_alias) {
  for (int64_t i = 0; i < num_parts; ++i) {
    for (int which = 0; which < 2; ++which) {
      const TensorView& in = which == 0 ? outs[i] : lses[i];
      const bool alias = i == 0 && (which == 0 ? out_is_alias : lse_is_alias);
      if (alias || !SharesBytes(bytes, ViewBytes(in.data, in.dtype, in.shape, in.strides))) {
        continue;
      }
      return Invalid(name + " overlaps input " + Name(which == 0 ? "outs" : "lses", i) +
                     ": outputs must not overlap inputs (out may be outs[0] "
                     "and lse lses[0] exactly: same data, dtype and strides)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateMerge(const TensorView* outs, const TensorView* lses,
                     int64_t num_parts, const MutableTensorView& out,
                     const MutableTensorView& lse, MergeProblem* p) {
  Status s = CheckParts(outs, lses, num_parts);
  if (!s.ok()) return s;
  const int64_t* want = outs[0].shape;
  const int64_t want_lse[4] = {want[0], want[1], want[2], 1};
  ByteRange ro, rl;
  s = CheckOutput("out", out, want, false, &ro);
  if (!s.ok()) return s;
  const bool out_alias = SameView(out, outs[0]);
  const bool has_lse = lse.data != nullptr;
  if (!has_lse && (lse.shape[0] | lse.shape[1] | lse.shape[2] | lse.shape[3]) != 0) {
    return Invalid("lse.data is null with shape " + ShapeString(lse.shape) +
                   " (leave every extent 0 for no LSE)");
  }
  if (has_lse) {
    s = CheckOutput("lse", lse, want_lse, true, &rl);
    if (!s.ok()) return s;
    if (SharesBytes(ViewBytes(lse.data, lse.dtype, lse.shape, lse.strides),
                    ViewBytes(out.data, out.dtype, out.shape, out.strides))) {
      return Invalid("lse overlaps out");
    }
  }
  const bool lse_alias = has_lse && SameView(lse, lses[0]);
  // Each output may be its own alias only: out may not touch lses[0] even
  // where lse aliases it.
  const ByteSet out_bytes = ViewBytes(out.data, out.dtype, out.shape, out.strides);
  s = CheckAgainstInputs("out", out_bytes, outs, lses, num_parts, out_alias, false);
  if (!s.ok()) return s;
  if (has_lse) {
    const ByteSet lse_bytes = ViewBytes(lse.data, lse.dtype, lse.shape, lse.strides);
    s = CheckAgainstInputs("lse", lse_bytes, outs, lses, num_parts, false, lse_alias);
    if (!s.ok()) return s;
  }
  p->batch = want[0];
  p->heads = want[1];
  p->len = want[2];
  p->head_dim = want[3];
  return Status::Ok();
}

}  // namespace simdattn
