// The multi-head attention layer's construction, config validation and the
// small helpers shared by its calls.

#include <new>
#include <string>

#include "lib/mha/mha_internal.h"

namespace simdattn {

TensorView MhaHeadsView(const void* data, DType dtype, int64_t ld, int64_t col,
                        bool batch_first, int64_t batch, int64_t heads,
                        int64_t len, int64_t d) {
  TensorView v;
  v.data = static_cast<const char*>(data) + col * DTypeSize(dtype);
  v.dtype = dtype;
  v.shape[0] = batch;
  v.shape[1] = heads;
  v.shape[2] = len;
  v.shape[3] = d;
  v.strides[0] = batch_first ? len * ld : ld;
  v.strides[1] = d;
  v.strides[2] = batch_first ? ld : batch * ld;
  v.strides[3] = 1;
  return v;
}

Status MhaReserve(std::vector<unsigned char>* buffer, size_t bytes, const char* what) {
  try {
    if (buffer->size() < bytes) buffer->resize(bytes);
  } catch (const std::bad_alloc&) {
    Status s;
    s.code = StatusCode::kOutOfMemory;
    s.message = std::string("cannot allocate ") + what + " (" + std::to_string(bytes) + " bytes)";
    return s;
  }
  return Status::Ok();
}

namespace {

Status Positive(const char* field, int64_t value) {
  if (value >= 1) return Status::Ok();
  return Invalid(std::string("config.") + field + " = " + std::to_string(value) +
                 " (want >= 1)");
}

// Fills the defaults of c and checks every field.
Status ResolveConfig(MhaConfig* c) {
  Status s = Positive("embed_dim", c->embed_dim);
  if (s.ok()) s = Positive("num_heads", c->num_heads);
  if (!s.ok()) return s;
  if (c->num_kv_heads == 0) c->num_kv_heads = c->num_heads;
  if (c->kdim == 0) c->kdim = c->embed_dim;
  if (c->vdim == 0) c->vdim = c->embed_dim;
  if (c->head_dim == 0) {
    if (c->embed_dim % c->num_heads != 0) {
      return Invalid("config.embed_dim = " + std::to_string(c->embed_dim) +
                     " is not a multiple of num_heads = " + std::to_string(c->num_heads) +
                     " (set head_dim)");
    }
    c->head_dim = c->embed_dim / c->num_heads;
  }
  s = Positive("num_kv_heads", c->num_kv_heads);
  if (s.ok()) s = Positive("head_dim", c->head_dim);
  if (s.ok()) s = Positive("kdim", c->kdim);
  if (s.ok()) s = Positive("vdim", c->vdim);
  if (!s.ok()) return s;
  if (c->num_heads % c->num_kv_heads != 0) {
    return Invalid("config.num_kv_heads = " + std::to_string(c->num_kv_heads) +
                   " does not divide num_heads = " + std::to_string(c->num_heads));
  }
  if (c->dtype != DType::kF32 && c->dtype != DType::kF16 && c->dtype != DType::kBF16) {
    return Invalid(std::string("config.dtype = ") + DTypeName(c->dtype) +
                   " (want f32, f16 or bf16)");
  }
  return Status::Ok();
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(Impl* impl) : impl_(impl) {}
MultiHeadAttention::~MultiHeadAttention() { delete impl_; }

Status MultiHeadAttention::Create(const MhaConfig& config, MultiHeadAttention** out) {
  if (out == nullptr) return Invalid("out is null");
  MhaConfig c = config;
  Status s = ResolveConfig(&c);
  if (!s.ok()) return s;
  Impl* impl = new (std::nothrow) Impl;
  MultiHeadAttention* layer = impl == nullptr ? nullptr : new (std::nothrow) MultiHeadAttention(impl);
  if (layer == nullptr) {
    delete impl;
    s.code = StatusCode::kOutOfMemory;
    s.message = "cannot allocate the layer";
    return s;
  }
  impl->config = c;
  impl->nq = c.num_heads * c.head_dim;
  impl->nkv = c.num_kv_heads * c.head_dim;
  *out = layer;
  return Status::Ok();
}

const MhaConfig& MultiHeadAttention::config() const { return impl_->config; }
bool MultiHeadAttention::loaded() const { return impl_->loaded; }

}  // namespace simdattn
