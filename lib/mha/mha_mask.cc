// The layer's PyTorch-convention masks (True = masked out, or additive f32)
// turned into one SEMANTICS.md mask for the attention call.

#include <cstring>
#include <limits>
#include <string>

#include "lib/mha/mha_internal.h"

namespace simdattn {
namespace {

std::string Dims(const MhaMask& m) {
  std::string s = "[";
  for (int64_t d = 0; d < m.ndim && d < 3; ++d) s += (d ? ", " : "") + std::to_string(m.shape[d]);
  return s + "]";
}

Status CheckMask(const char* name, const MhaMask& m, int64_t batch, int64_t heads,
                 int64_t q_len, int64_t kv_len) {
  if (m.data == nullptr) return Status::Ok();
  if (m.dtype != DType::kBool && m.dtype != DType::kF32) {
    return Invalid(std::string(name) + ".dtype = " + DTypeName(m.dtype) + " (want bool or f32)");
  }
  bool ok;
  std::string want;
  if (std::strcmp(name, "key_padding_mask") == 0) {
    ok = m.ndim == 2 && m.shape[0] == batch && m.shape[1] == kv_len;
    want = "[" + std::to_string(batch) + ", " + std::to_string(kv_len) + "]";
  } else {
    ok = (m.ndim == 2 && m.shape[0] == q_len && m.shape[1] == kv_len) ||
         (m.ndim == 3 && m.shape[0] == batch * heads && m.shape[1] == q_len &&
          m.shape[2] == kv_len);
    want = "[" + std::to_string(q_len) + ", " + std::to_string(kv_len) + "] or [" +
           std::to_string(batch * heads) + ", " + std::to_string(q_len) + ", " +
           std::to_string(kv_len) + "]";
  }
  if (ok) return Status::Ok();
  return Invalid(std::string(name) + ": shape " + Dims(m) + ", want " + want);
}

// The additive value of element i of a PyTorch mask.
float Additive(const MhaMask& m, int64_t i) {
  if (m.dtype == DType::kBool) {
    return static_cast<const uint8_t*>(m.data)[i] != 0 ? -std::numeric_limits<float>::infinity()
                                                       : 0.0f;
  }
  return static_cast<const float*>(m.data)[i];
}

}  // namespace

Status MhaBuildMask(const MhaForwardOptions& options, int64_t batch, int64_t heads,
                    int64_t q_len, int64_t kv_len, bool bias_kv,
                    std::vector<unsigned char>* buffer, TensorView* mask) {
  const MhaMask& kp = options.key_padding_mask;
  const MhaMask& am = options.attn_mask;
  Status s = CheckMask("key_padding_mask", kp, batch, heads, q_len, kv_len);
  if (s.ok()) s = CheckMask("attn_mask", am, batch, heads, q_len, kv_len);
  if (!s.ok()) return s;
  *mask = options.attention.mask;
  if (kp.data == nullptr && am.data == nullptr) return Status::Ok();
  if (options.attention.mask.data != nullptr) {
    return Invalid("options.attention.mask with key_padding_mask or attn_mask: give one kind");
  }
  const bool per_head = am.data != nullptr && am.ndim == 3;
  TensorView& v = *mask;
  v = TensorView();
  v.dtype = DType::kF32;
  if (kp.data == nullptr && am.dtype == DType::kF32 && !bias_kv) {  // the caller's f32 mask
    v.data = am.data;
    v.shape[0] = per_head ? batch : 1;
    v.shape[1] = per_head ? heads : 1;
    v.shape[2] = q_len;
    v.shape[3] = kv_len;
    v.strides[0] = per_head ? heads * q_len * kv_len : 0;
    v.strides[1] = per_head ? q_len * kv_len : 0;
    v.strides[2] = kv_len;
    v.strides[3] = 1;
    return Status::Ok();
  }
  const int64_t mb = (per_head || kp.data != nullptr) ? batch : 1, mh = per_head ? heads : 1;
  const int64_t lk = kv_len + (bias_kv ? 1 : 0);
  s = MhaReserve(buffer, static_cast<size_t>(mb * mh * q_len * lk) * 4, "the combined mask");
  if (!s.ok()) return s;
  float* dst = reinterpret_cast<float*>(buffer->data());
  for (int64_t b = 0; b < mb; ++b) {
    for (int64_t h = 0; h < mh; ++h) {
      for (int64_t i = 0; i < q_len; ++i) {
        float* row = dst + ((b * mh + h) * q_len + i) * lk;
        for (int64_t j = 0; j < kv_len; ++j) {
          float x = 0.0f;
          if (am.data != nullptr) {
            x += Additive(am, per_head ? ((b * heads + h) * q_len + i) * kv_len + j : i * kv_len + j);
          }
          if (kp.data != nullptr) x += Additive(kp, b * kv_len + j);
          row[j] = x;
        }
        if (bias_kv) row[kv_len] = 0.0f;  // the bias key: padded as PyTorch pads
      }
    }
  }
  v.data = dst;
  v.shape[0] = mb;
  v.shape[1] = mh;
  v.shape[2] = q_len;
  v.shape[3] = lk;
  v.strides[0] = mh * q_len * lk;
  v.strides[1] = q_len * lk;
  v.strides[2] = lk;
  v.strides[3] = 1;
  return Status::Ok();
}

}  // namespace simdattn
