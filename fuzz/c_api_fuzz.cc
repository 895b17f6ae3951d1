// libFuzzer target: the C API (simdattn.h). Tensors, options with their
// array lengths, enum values, struct sizes (this version's, the first
// run_info's, too small, larger with a zero or non-zero tail) and the
// executor come from the input. A failed call must leave every buffer as
// it was and set simdattn_last_error(); a successful one must write what
// the C++ API writes for the same arguments, bit for bit. Also fuzzes
// simdattn_set_max_target's names and simdattn_get_info's struct size.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "simdattn/attention.h"
#include "simdattn/simdattn.h"

namespace simdattn {
namespace fuzz {
namespace {

struct CCase {
  int64_t b = 1, hq = 1, hkv = 1, lq = 1, lk = 1, d = 1;
  TensorBuf q, k, v, o, lse;
  bool has_lse = false;
  std::vector<float> slopes, sinks;
  std::vector<int64_t> lens64;
  std::vector<int32_t> lens32;
  // Options in a larger block, so that a struct_size past the struct's
  // reads a tail of our choosing.
  struct {
    simdattn_options options;
    uint8_t tail[16];
  } opt;
  simdattn_exec exec;
  std::string desc;
};

simdattn_tensor ToC(TensorBuf& t, int32_t dtype) {
  simdattn_tensor c;
  c.data = t.buf->data() + t.base;
  c.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    c.shape[i] = t.shape[i];
    c.strides[i] = t.strides[i];
  }
  return c;
}

TensorBuf Dense(FuzzInput* in, DType dtype, int64_t b, int64_t h, int64_t s, int64_t d,
                uint8_t fill) {
  const int64_t shape[4] = {b, h, s, d};
  const int perm_bhsd[3] = {0, 1, 2}, perm_bshd[3] = {0, 2, 1};
  int64_t strides[4];
  LayoutStrides(shape, in->Bool() ? perm_bhsd : perm_bshd, in->Range(0, 2), nullptr, strides);
  return MakeTensor(dtype, shape, strides, fill);
}

// The struct size a caller declares: this version's mostly; now and then
// too small, or larger with the tail (zero or not) that follows.
size_t TakeStructSize(FuzzInput* in, size_t size, uint8_t* tail, size_t tail_bytes) {
  const int64_t kind = in->Range(0, 15);
  if (kind == 13) return size / 2;
  if (kind >= 14 && tail != nullptr) {
    std::memset(tail, 0, tail_bytes);
    if (kind == 15) tail[in->Range(0, static_cast<int64_t>(tail_bytes) - 1)] = 1;
    return size + tail_bytes;
  }
  return size;
}

void TakeOptions(FuzzInput* in, CCase* c) {
  simdattn_options& o = c->opt.options;
  simdattn_options_init(&o);
  o.struct_size = TakeStructSize(in, sizeof(o), c->opt.tail, sizeof(c->opt.tail));
  o.has_scale = in->OneIn(4);
  o.scale = in->Range(0, 4) / 4.0f;
  o.causal = in->Bool();
  o.alignment = static_cast<int32_t>(in->Range(0, 3));
  o.window_left = in->Range(-1, 8);
  o.window_right = in->Range(-1, 8);
  o.softcap = in->OneIn(4) ? 20.0f : 0.0f;
  const int64_t heads = c->hq + (in->OneIn(16) ? 1 : 0);
  if (in->OneIn(3)) {
    c->slopes.assign(static_cast<size_t>(heads), 0.25f);
    o.alibi_slopes = c->slopes.data();
    o.num_alibi_slopes = heads;
  }
  if (in->OneIn(3)) {
    c->sinks.assign(static_cast<size_t>(heads), 0.5f);
    o.sinks = c->sinks.data();
    o.num_sinks = in->OneIn(16) ? 0 : heads;
  }
  if (in->OneIn(3)) {
    for (int64_t b = 0; b < c->b; ++b) {
      c->lens64.push_back(in->Range(0, c->lk));
      c->lens32.push_back(static_cast<int32_t>(c->lens64.back()));
    }
    o.kv_lengths_dtype = static_cast<int32_t>(in->Range(3, 6));
    o.kv_lengths = o.kv_lengths_dtype == SIMDATTN_I64 ? static_cast<const void*>(c->lens64.data())
                                                     : c->lens32.data();
    o.num_kv_lengths = c->b - (in->OneIn(16) ? 1 : 0);
  }
  o.dropout_p = in->OneIn(4) ? 0.25f : 0.0f;
  o.dropout_seed = in->Byte();
}

void Decode(FuzzInput* in, CCase* c) {
  c->b = in->Range(1, 3);
  c->hkv = in->Range(1, 3);
  c->hq = c->hkv * in->Range(1, 3);
  c->lq = in->Range(1, 24);
  c->lk = in->Range(1, 40);
  c->d = in->Range(1, 32);
  const DType tq = TakeDType(in, false), tkv = TakeDType(in, false), to = TakeDType(in, false);
  c->q = Dense(in, tq, c->b, c->hq, c->lq, c->d, 0);
  c->k = Dense(in, tkv, c->b, c->hkv, c->lk, c->d, 0);
  c->v = Dense(in, tkv, c->b, c->hkv, c->lk, c->d, 0);
  c->o = Dense(in, to, c->b, c->hq, c->lq, c->d, 0xA5);
  const uint32_t seed = in->Byte();
  FillValues(&c->q, seed, false);
  FillValues(&c->k, seed + 1, false);
  FillValues(&c->v, seed + 2, false);
  c->has_lse = in->Bool();
  c->lse = Dense(in, DType::kF32, c->b, c->hq, c->lq, 1, 0x5A);
  TakeOptions(in, c);
  simdattn_exec_init(&c->exec);
  c->exec.struct_size = TakeStructSize(in, sizeof(c->exec), nullptr, 0);
  static simdattn_pool* pool = simdattn_pool_create(2);
  if (in->Bool()) c->exec.pool = pool;
  static const char* const kCaps[4] = {nullptr, "AVX2", "SCALAR", "bogus"};
  c->exec.max_target = kCaps[in->Range(0, 7) % 4 == 3 && !in->OneIn(4) ? 0 : in->Range(0, 3)];
  c->desc = "B" + std::to_string(c->b) + " Hq" + std::to_string(c->hq) + " Hkv" +
            std::to_string(c->hkv) + " Lq" + std::to_string(c->lq) + " Lk" +
            std::to_string(c->lk) + " D" + std::to_string(c->d);
}

// The C++ call the C one stands for, on its own copies of O and LSE.
Status CppCall(const CCase& c, TensorBuf* o, TensorBuf* lse) {
  const simdattn_options& co = c.opt.options;
  AttentionOptions opt;
  if (co.has_scale) opt.scale = co.scale;
  opt.causal = co.causal != 0;
  if (co.alignment == SIMDATTN_ALIGN_TOP_LEFT) opt.alignment = Alignment::kTopLeft;
  if (co.alignment == SIMDATTN_ALIGN_BOTTOM_RIGHT) opt.alignment = Alignment::kBottomRight;
  opt.window_left = co.window_left;
  opt.window_right = co.window_right;
  opt.softcap = co.softcap;
  opt.alibi_slopes = co.alibi_slopes;
  opt.sinks = co.sinks;
  if (co.kv_lengths != nullptr && co.kv_lengths_dtype == SIMDATTN_I64) {
    opt.kv_lengths = c.lens64.data();
  } else if (co.kv_lengths != nullptr) {
    opt.kv_lengths_i32 = c.lens32.data();
  }
  opt.dropout_p = co.dropout_p;
  opt.dropout_seed = co.dropout_seed;
  ExecutionOptions exec;
  exec.max_target = c.exec.max_target;
  return Attention(c.q.View(), c.k.View(), c.v.View(), o->Mutable(), opt,
                   c.has_lse ? lse->Mutable() : MutableTensorView(), exec);
}

void CheckCall(CCase* c) {
  const std::vector<uint8_t> o_before = *c->o.buf, lse_before = *c->lse.buf;
  const std::vector<uint8_t> q_before = *c->q.buf, k_before = *c->k.buf, v_before = *c->v.buf;
  simdattn_tensor q = ToC(c->q, static_cast<int32_t>(c->q.dtype));
  simdattn_tensor k = ToC(c->k, static_cast<int32_t>(c->k.dtype));
  simdattn_tensor v = ToC(c->v, static_cast<int32_t>(c->v.dtype));
  simdattn_tensor o = ToC(c->o, static_cast<int32_t>(c->o.dtype));
  simdattn_tensor lse = ToC(c->lse, SIMDATTN_F32);
  struct {
    simdattn_run_info info;
    uint8_t tail[8];
  } info_block;
  std::memset(&info_block, 0, sizeof(info_block));
  info_block.info.struct_size = c->desc.size() % 3 == 0 ? 32 : sizeof(simdattn_run_info);
  const int status = simdattn_attention(&q, &k, &v, &o, &c->opt.options,
                                        c->has_lse ? &lse : nullptr, &c->exec, &info_block.info);
  if (*c->q.buf != q_before || *c->k.buf != k_before || *c->v.buf != v_before) {
    Fail("an input changed", c->desc);
  }
  if (status != SIMDATTN_OK) {
    if (std::strlen(simdattn_last_error()) == 0) Fail("error without a message", c->desc);
    if (*c->o.buf != o_before || *c->lse.buf != lse_before) {
      Fail(std::string("failed call wrote: ") + simdattn_last_error(), c->desc);
    }
    return;
  }
  if (simdattn_last_error()[0] != '\0') Fail("success left an error message", c->desc);
  TensorBuf o2 = c->o, lse2 = c->lse;
  o2.buf = std::make_shared<std::vector<uint8_t>>(o_before);
  lse2.buf = std::make_shared<std::vector<uint8_t>>(lse_before);
  const Status s = CppCall(*c, &o2, &lse2);
  if (!s.ok()) Fail("C accepted what C++ rejects: " + s.message, c->desc);
  if (*o2.buf != *c->o.buf || (c->has_lse && *lse2.buf != *c->lse.buf)) {
    Fail("C and C++ results differ", c->desc);
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace simdattn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace simdattn::fuzz;  // NOLINT(build/namespaces)
  FuzzInput in(data, size);
  CCase c;
  Decode(&in, &c);
  CheckCall(&c);
  // Target names and the info struct's size.
  char name[12] = {0};
  for (int i = 0; i < 11; ++i) name[i] = static_cast<char>(in.Byte());
  if (simdattn_set_max_target(name) == SIMDATTN_OK) simdattn_set_max_target(nullptr);
  simdattn_info info;
  info.struct_size = in.OneIn(4) ? 8 : sizeof(info);
  if (simdattn_get_info(&info) == SIMDATTN_OK && info.num_available < 1) {
    Fail("no target available", "");
  }
  return 0;
}
