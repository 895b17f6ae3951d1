// libFuzzer target: Attention()'s validation and kernels. Shapes, strides,
// dtypes, options, aliasing and the executor come from the input (small
// extents: B, Hkv, Hq / Hkv <= 4, Lq <= 40, Lk <= 64, head dims <= 40).
// Each call must either fail with every buffer as it was, or succeed with
// inputs and the bytes around O untouched, O and LSE within SEMANTICS.md's
// bounds of ReferenceAttention (when no Inf/NaN was fed), the same bits on
// one thread, and an output that shares no byte with an input.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "lib/reference.h"
#include "simdattn/attention.h"

namespace simdattn {
namespace fuzz {
namespace {

struct Case {
  int64_t b = 1, hq = 1, hkv = 1, lq = 1, lk = 1, dk = 1, dv = 1;
  TensorBuf q, k, v, o, lse, mask;
  bool has_lse = false, specials = false;
  int alias = 0;  // 1: o inside q's buffer; 2: lse inside k's buffer
  AttentionOptions options;
  std::vector<float> slopes, sinks;
  std::vector<int64_t> lens;
  std::vector<int32_t> lens32;
  ExecutionOptions exec;
  std::vector<uint8_t> workspace;
  std::string desc;
};

// Strides for a view of `shape` chosen by the input: a dimension order, row
// padding, broadcast (inputs only), and now and then a bad last stride or a
// negative one.
void TakeStrides(FuzzInput* in, const int64_t* shape, bool input, int64_t* strides) {
  static const int kPerms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                   {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const int* perm = kPerms[in->Range(0, 5)];
  const int64_t pad = in->Range(0, 3) == 3 ? in->Range(1, 5) : 0;
  bool broadcast[3] = {false, false, false};
  if (input && in->OneIn(6)) broadcast[in->Range(0, 1)] = true;
  LayoutStrides(shape, perm, pad, broadcast, strides);
  if (in->OneIn(24)) strides[in->Range(0, 2)] *= -1;
  if (in->OneIn(48)) strides[3] = in->Range(0, 2) * 2;  // 0 or 2 (a mask may broadcast)
  // A stride of 2^62 over an extent of 3 or more: byte offsets past int64.
  const int huge = static_cast<int>(in->Range(0, 3));
  if (in->OneIn(64) && shape[huge] >= 3) strides[huge] = int64_t{1} << 62;
}

// A tensor of `shape` whose strides, when they would address more than
// kMaxSpan elements (an overflow case), are kept but its buffer is not:
// the view then points at a one-byte stand-in the call must never touch
// (as for a view with an extent <= 0).
TensorBuf TakeTensor(FuzzInput* in, DType dtype, const int64_t* shape, bool input,
                     uint8_t fill, int64_t extra = 0) {
  constexpr int64_t kMaxSpan = int64_t{1} << 22;
  int64_t strides[4];
  TakeStrides(in, shape, input, strides);
  bool huge = false;
  for (int i = 0; i < 4; ++i) {  // a stride matters only where the extent exceeds 1
    huge |= shape[i] > 1 && (strides[i] > kMaxSpan || strides[i] < -kMaxSpan);
  }
  int64_t lo = 0, hi = 0;
  if (!huge) OffsetRange(shape, strides, &lo, &hi);
  huge |= hi - lo > kMaxSpan;
  if (huge || shape[0] <= 0 || shape[1] <= 0 || shape[2] <= 0 || shape[3] <= 0) {
    TensorBuf t;
    t.buf = std::make_shared<std::vector<uint8_t>>(1, fill);
    t.dtype = dtype;
    t.stand_in = true;
    for (int i = 0; i < 4; ++i) t.shape[i] = shape[i], t.strides[i] = strides[i];
    return t;
  }
  return MakeTensor(dtype, shape, strides, fill, extra);
}

bool Usable(const TensorBuf& t) { return !t.stand_in; }

// The options that take arrays and numbers.
void TakeOptions(FuzzInput* in, Case* c) {
  AttentionOptions& o = c->options;
  const float kScales[5] = {0.0f, 0.125f, 0.5f, -1.0f, NAN};
  const int64_t scale = in->Range(0, 7);
  if (scale < 5 && (scale < 3 || in->OneIn(8))) o.scale = kScales[scale];
  o.causal = in->Bool();
  const int64_t align = in->Range(0, 7);
  if (align < 2) o.alignment = static_cast<Alignment>(align);
  if (align == 7 && in->OneIn(4)) o.alignment = static_cast<Alignment>(5);
  const int64_t windows[6] = {-1, 0, 3, c->lk, c->lk + c->lq + 2, int64_t{1} << 40};
  o.window_left = in->Bool() ? -1 : windows[in->Range(0, 5)];
  o.window_right = in->Bool() ? -1 : windows[in->Range(0, 5)];
  const float kSoftcaps[5] = {0.0f, 5.0f, 30.0f, -1.0f, INFINITY};
  o.softcap = kSoftcaps[in->Range(0, 2) == 0 ? in->Range(1, 4) : 0];
  if (in->OneIn(4)) {
    for (int64_t h = 0; h < c->hq; ++h) c->slopes.push_back(in->Range(0, 8) / 8.0f);
    o.alibi_slopes = c->slopes.data();
  }
  if (in->OneIn(4)) {
    for (int64_t h = 0; h < c->hq; ++h) c->sinks.push_back(in->Range(-16, 16) / 8.0f);
    o.sinks = c->sinks.data();
  }
  const int64_t lengths = in->Range(0, 5);
  for (int64_t b = 0; b < c->b && lengths >= 3; ++b) {
    const int64_t len = in->OneIn(32) ? c->lk + 1 : in->Range(0, c->lk);
    c->lens.push_back(len);
    c->lens32.push_back(static_cast<int32_t>(len));
  }
  if (lengths == 3 || lengths == 5) o.kv_lengths = c->lens.data();
  if (lengths >= 4) o.kv_lengths_i32 = c->lens32.data();
  const float kDropout[6] = {0.0f, 0.1f, 0.5f, 0.999f, 1.0f, NAN};
  o.dropout_p = kDropout[in->Range(0, 3) == 0 ? in->Range(1, 5) : 0];
  o.dropout_seed = in->Byte();
}

// The optional mask: no mask, bool, f32 or f16 (now and then another
// dtype), each extent full or 1 (now and then neither).
void TakeMask(FuzzInput* in, Case* c, uint32_t seed) {
  const int64_t kind = in->Range(0, 4);
  if (kind == 0) return;
  const DType dtypes[4] = {DType::kBool, DType::kF32, DType::kF16, DType::kBF16};
  const DType dtype = dtypes[kind == 4 && in->OneIn(4) ? 3 : (kind - 1) % 3];
  const int64_t full[4] = {c->b, c->hq, c->lq, c->lk};
  int64_t shape[4];
  for (int i = 0; i < 4; ++i) {
    shape[i] = in->Bool() ? full[i] : 1;
    if (in->OneIn(40)) shape[i] = full[i] + 1;
  }
  c->mask = TakeTensor(in, dtype, shape, true, 0);
  if (Usable(c->mask)) {
    FillValues(&c->mask, seed, false);
    if (dtype == DType::kBool) {  // about 70% attend
      uint32_t x = seed;
      for (uint8_t& byte : *c->mask.buf) byte = ((x = x * 69069u + 1u) >> 24) < 180;
    } else if (c->specials) {
      c->mask.Set(0, 0, 0, 0, -INFINITY);
    }
  }
  c->options.mask = c->mask.View();
}

// Shapes (now and then invalid), dtypes, views, options and the executor.
bool DecodeCase(FuzzInput* in, Case* c) {
  c->b = in->Range(1, 4);
  c->hkv = in->Range(1, 4);
  c->hq = c->hkv * in->Range(1, 4) + (in->OneIn(32) ? 1 : 0);
  c->lq = in->OneIn(64) ? 0 : in->Range(1, 40);
  c->lk = in->OneIn(64) ? 0 : in->Range(1, 64);
  c->dk = in->Range(1, 40);
  c->dv = in->Range(1, 40);
  const DType tq = TakeDType(in, true), tkv = TakeDType(in, true), to = TakeDType(in, true);
  c->specials = in->OneIn(8);
  const uint32_t seed = in->Byte() | uint32_t{in->Byte()} << 8;
  const int64_t q_shape[4] = {c->b, c->hq, c->lq, c->dk};
  const int64_t k_shape[4] = {c->b, c->hkv, c->lk, c->dk + (in->OneIn(48) ? 1 : 0)};
  const int64_t v_shape[4] = {c->b, c->hkv, c->lk, c->dv};
  const int64_t o_shape[4] = {c->b, c->hq, c->lq, c->dv};
  c->alias = in->OneIn(6) ? in->Range(1, 2) : 0;
  // Room after Q (K) for O (LSE) to sit in when aliasing.
  const int64_t o_room = c->alias == 1 ? c->b * c->hq * std::max<int64_t>(c->lq, 1) * c->dv * 4 * 2 : 0;
  const int64_t l_room = c->alias == 2 ? c->b * c->hq * std::max<int64_t>(c->lq, 1) * 4 * 2 : 0;
  c->q = TakeTensor(in, tq, q_shape, false, 0, o_room);
  c->k = TakeTensor(in, tkv, k_shape, true, 0, l_room);
  c->v = TakeTensor(in, in->OneIn(64) ? tq : tkv, v_shape, true, 0);
  c->o = TakeTensor(in, to, o_shape, false, 0xA5);
  TensorBuf* const inputs[3] = {&c->q, &c->k, &c->v};
  for (uint32_t i = 0; i < 3; ++i) {
    if (Usable(*inputs[i])) {
      FillValues(inputs[i], seed + i, c->specials);
    }
  }
  c->has_lse = in->Bool();
  if (c->has_lse) {
    const int64_t lse_shape[4] = {c->b, c->hq, c->lq, 1};
    c->lse = TakeTensor(in, in->OneIn(32) ? DType::kF16 : DType::kF32, lse_shape, false, 0x5A);
  }
  // O (LSE) moves into Q's (K's) buffer at a chosen multiple of its
  // element size, where the buffer has room for all of it.
  TensorBuf* host = c->alias == 1 ? &c->q : &c->k;
  TensorBuf* guest = c->alias == 1 ? &c->o : &c->lse;
  const int64_t room = static_cast<int64_t>(host->buf->size()) -
                       static_cast<int64_t>(guest->buf == nullptr ? 0 : guest->buf->size());
  if (c->alias != 0 && (c->alias == 1 || c->has_lse) && Usable(*host) && Usable(*guest) &&
      room >= 0) {
    const int64_t size = DTypeSize(guest->dtype);
    guest->base += in->Range(0, room / size) * size;
    guest->buf = host->buf;
  } else {
    c->alias = 0;
  }
  TakeOptions(in, c);
  TakeMask(in, c, seed + 7);
  c->desc = "B" + std::to_string(c->b) + " Hq" + std::to_string(c->hq) + " Hkv" +
            std::to_string(c->hkv) + " Lq" + std::to_string(c->lq) + " Lk" +
            std::to_string(c->lk) + " Dk" + std::to_string(c->dk) + " Dv" +
            std::to_string(c->dv) + " q " + DTypeName(tq) + " kv " + DTypeName(tkv) +
            " o " + DTypeName(to) + (c->specials ? " specials" : "") +
            " alias " + std::to_string(c->alias);
  return true;
}

// A host engine's parallel-for: runs the tasks in reverse, on this thread.
void ReverseParallelFor(void*, int64_t n, void (*task)(void*, int64_t), void* arg) {
  for (int64_t i = n - 1; i >= 0; --i) task(arg, i);
}

ThreadPool& Pool(int threads) {
  static ThreadPool* pools[3] = {new ThreadPool(1), new ThreadPool(2), new ThreadPool(3)};
  return *pools[threads - 1];
}

// The executor, the call's cap, and a workspace (WorkspaceSize's, or one
// byte short).
void TakeExec(FuzzInput* in, Case* c) {
  ExecutionOptions& e = c->exec;
  const int64_t kind = in->Range(0, 4);
  if (kind <= 2) e.pool = &Pool(static_cast<int>(kind) + 1);
  if (kind == 4) {
    e.parallel_for = &ReverseParallelFor;
    e.parallel_for_threads = static_cast<int>(in->Range(0, 3)) - (in->OneIn(32) ? 5 : 0);
  }
  static const char* const kCaps[6] = {nullptr, "", "AVX2", "scalar", "SSE4", "NO_SUCH"};
  const int64_t cap = in->Range(0, 7);
  e.max_target = cap < 5 ? kCaps[cap] : cap == 5 && in->OneIn(4) ? kCaps[5] : nullptr;
  if (in->OneIn(4)) {
    size_t bytes = 0;
    if (WorkspaceSize(c->q.View(), c->k.View(), c->v.View(), c->options, e, &bytes).ok()) {
      const bool short_one = in->OneIn(8) && bytes > 0;
      c->workspace.assign(bytes - (short_one ? 1 : 0) + 1, 0);
      e.workspace = c->workspace.data() + 1;  // unaligned on purpose
      e.workspace_bytes = bytes - (short_one ? 1 : 0);
    }
  }
}

// Every buffer of a case as it was before the call (shared ones once).
struct Snapshot {
  std::vector<std::shared_ptr<std::vector<uint8_t>>> bufs;
  std::vector<std::vector<uint8_t>> saved;

  explicit Snapshot(const Case& c) {
    for (const TensorBuf* t : {&c.q, &c.k, &c.v, &c.o, &c.lse, &c.mask}) {
      if (t->buf == nullptr) continue;
      if (std::find(bufs.begin(), bufs.end(), t->buf) != bufs.end()) continue;
      bufs.push_back(t->buf);
      saved.push_back(*t->buf);
    }
  }
  void Restore() {
    for (size_t i = 0; i < bufs.size(); ++i) *bufs[i] = saved[i];
  }
  // Whether every byte is as saved, except the elements of `out` (when
  // not null) in their buffers.
  bool Unchanged(const std::vector<const TensorBuf*>& outs) const {
    for (size_t i = 0; i < bufs.size(); ++i) {
      std::vector<uint8_t> written(bufs[i]->size(), 0);
      for (const TensorBuf* o : outs) {
        if (o->buf == bufs[i]) o->MarkElements(&written);
      }
      for (size_t j = 0; j < saved[i].size(); ++j) {
        if ((*bufs[i])[j] != saved[i][j] && written[j] == 0) return false;
      }
    }
    return true;
  }
};

bool SharesElement(const TensorBuf& a, const TensorBuf& b) {
  if (a.buf != b.buf) return false;
  std::vector<uint8_t> ma(a.buf->size(), 0), mb(a.buf->size(), 0);
  a.MarkElements(&ma);
  b.MarkElements(&mb);
  for (size_t i = 0; i < ma.size(); ++i) {
    if (ma[i] != 0 && mb[i] != 0) return true;
  }
  return false;
}

double Bound(const Case& c) {
  double bound = 2e-5;
  for (DType t : {c.q.dtype, c.k.dtype, c.o.dtype}) {
    bound = std::max(bound, t == DType::kBF16 ? 1.6e-2 : t == DType::kF16 ? 2e-3 : 2e-5);
  }
  // Dropout scales kept weights by 1 / (1 - p): so does their rounding error.
  return bound / (1.0 - c.options.dropout_p);
}

// O and LSE of a successful call against the reference.
void CompareWithReference(const Case& c) {
  std::vector<double> o_ref, lse_ref;
  const Status r = ReferenceAttention(c.q.View(), c.k.View(), c.v.View(), c.options, &o_ref,
                                      c.has_lse ? &lse_ref : nullptr);
  if (!r.ok()) Fail("Attention accepted a call the reference rejects: " + r.message, c.desc);
  if (c.specials) return;
  double max_v = 1.0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hkv; ++h)
      for (int64_t j = 0; j < c.lk; ++j)
        for (int64_t d = 0; d < c.dv; ++d) max_v = std::max<double>(max_v, std::fabs(c.v.Get(b, h, j, d)));
  const bool f32_qk = c.q.dtype == DType::kF32 && c.k.dtype == DType::kF32;
  size_t n = 0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.lq; ++i) {
        for (int64_t d = 0; d < c.dv; ++d, ++n) {
          const double err = std::fabs(c.o.Get(b, h, i, d) - o_ref[n]) / max_v;
          if (!(err <= Bound(c))) {
            Fail("O off the reference by " + std::to_string(err) + " at " + std::to_string(n),
                 c.desc);
          }
        }
        if (!c.has_lse) continue;
        const double want = lse_ref[static_cast<size_t>((b * c.hq + h) * c.lq + i)];
        const double got = c.lse.Get(b, h, i, 0);
        const bool same_inf = std::isinf(want) && got == want;
        if (!same_inf && !(std::fabs(got - want) <= (f32_qk ? 1e-4 : 1e-2))) {
          Fail("LSE " + std::to_string(got) + " but the reference has " + std::to_string(want),
               c.desc);
        }
      }
}

// The call's bytes of O and LSE, to compare runs.
std::vector<float> Written(const Case& c) {
  std::vector<float> out;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.lq; ++i) {
        for (int64_t d = 0; d < c.dv; ++d) out.push_back(c.o.Get(b, h, i, d));
        if (c.has_lse) out.push_back(c.lse.Get(b, h, i, 0));
      }
  return out;
}

Status Run(Case* c, const ExecutionOptions& exec) {
  return Attention(c->q.View(), c->k.View(), c->v.View(), c->o.Mutable(), c->options,
                   c->has_lse ? c->lse.Mutable() : MutableTensorView(), exec);
}

void CheckCall(Case* c) {
  Verbose(c->desc + "\n  " + Describe("q", c->q) + "\n  " + Describe("k", c->k) + "\n  " +
          Describe("v", c->v) + "\n  " + Describe("o", c->o) + "\n  " +
          Describe("mask", c->mask));
  Snapshot before(*c);
  const Status s = Run(c, c->exec);
  const TensorBuf& alias_in = c->alias == 1 ? c->q : c->k;
  const TensorBuf& alias_out = c->alias == 1 ? c->o : c->lse;
  if (!s.ok()) {
    if (s.code == StatusCode::kOk || s.message.empty()) Fail("error without a message", c->desc);
    if (s.code == StatusCode::kOutOfMemory || s.code == StatusCode::kInternal) {
      Fail("unexpected " + std::string(StatusCodeName(s.code)) + ": " + s.message, c->desc);
    }
    if (!before.Unchanged({})) Fail("failed call wrote: " + s.message, c->desc);
    if (c->alias != 0 && s.message.find("overlaps") != std::string::npos &&
        !SharesElement(alias_in, alias_out)) {
      Fail("rejected an output that shares no byte with an input: " + s.message, c->desc);
    }
    return;
  }
  if (c->alias != 0 && SharesElement(alias_in, alias_out)) {
    Fail("accepted an output that shares bytes with an input", c->desc);
  }
  std::vector<const TensorBuf*> outs = {&c->o};
  if (c->has_lse) outs.push_back(&c->lse);
  if (!before.Unchanged(outs)) Fail("wrote outside O and LSE", c->desc);
  CompareWithReference(*c);
  // The same bits on one thread, without a workspace.
  const std::vector<float> first = Written(*c);
  before.Restore();
  ExecutionOptions one;
  one.pool = &Pool(1);
  one.max_target = c->exec.max_target;
  if (!Run(c, one).ok()) Fail("the same call failed on one thread", c->desc);
  const std::vector<float> again = Written(*c);
  if (std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) != 0) {
    Fail("results differ between executors", c->desc);
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace simdattn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace simdattn::fuzz;  // NOLINT(build/namespaces)
  FuzzInput in(data, size);
  Case c;
  DecodeCase(&in, &c);
  TakeExec(&in, &c);
  CheckCall(&c);
  return 0;
}
