// libFuzzer target: the serving calls (serving.h) on views decoded from the
// input. AppendKv: slots (negative, duplicate, out of range), rotary
// tables and positions, q, paged NHD/HND caches, k/v/q interleaved in one
// fused buffer or overlapping a cache. MergeStates: 1-4 parts of mixed
// dtypes with -inf/NaN/+inf LSEs, the output aliasing the first part.
// PagedAttention: ragged sequences over shuffled pages. A failed call must
// leave every buffer as it was; a successful one must match a scalar model
// (AppendKv, MergeStates) or ReferenceAttention on each sequence's gathered
// K/V (PagedAttention) within SEMANTICS.md's bounds.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "lib/reference.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace fuzz {
namespace {

double BoundOf(DType t) { return t == DType::kBF16 ? 1.6e-2 : t == DType::kF16 ? 2e-3 : 2e-5; }

// A tensor over logical [n0, h, n2, d] stored as [n0, n2, h, d] (token
// major / NHD) or [n0, h, n2, d] (HND).
TensorBuf Stored(DType t, int64_t n0, int64_t h, int64_t n2, int64_t d, bool nhd, uint8_t fill,
                 int64_t extra = 0) {
  const int64_t shape[4] = {n0, h, n2, d};
  const int perm_nhd[3] = {0, 2, 1}, perm_hnd[3] = {0, 1, 2};
  int64_t strides[4];
  LayoutStrides(shape, nhd ? perm_nhd : perm_hnd, 0, nullptr, strides);
  return MakeTensor(t, shape, strides, fill, extra);
}

// Whether two views of one buffer share a byte (by enumeration).
bool ShareBytes(const TensorBuf& a, const TensorBuf& b) {
  if (a.buf != b.buf) return false;
  const std::set<int64_t> ea = a.ElementBytes(), eb = b.ElementBytes();
  for (int64_t x : ea) {
    if (eb.count(x) != 0) return true;
  }
  return false;
}

// Every buffer of a call as it was.
struct Saved {
  std::vector<std::shared_ptr<std::vector<uint8_t>>> bufs;
  std::vector<std::vector<uint8_t>> bytes;
  void Add(const TensorBuf& t) {
    if (t.buf == nullptr || std::find(bufs.begin(), bufs.end(), t.buf) != bufs.end()) return;
    bufs.push_back(t.buf);
    bytes.push_back(*t.buf);
  }
  bool Unchanged() const {
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (*bufs[i] != bytes[i]) return false;
    }
    return true;
  }
};

// ---------------------------------------------------------------- append

// What AppendKv must store for value x in dtype t, rotated or not: the f32
// result rounded once (so within one rounding of the double result).
bool Close(float got, double want, DType t) {
  if (std::isnan(want)) return std::isnan(got);
  const double ulp = t == DType::kF32 ? 1e-6 : t == DType::kF16 ? 1e-3 : 8e-3;
  return std::fabs(got - want) <= ulp * std::max(1.0, std::fabs(want)) + 1e-6;
}

// x' of pair (a, b) of row `row` (Dk values) at position p, or the value
// itself past the rotary dims.
double Rotated(const std::vector<float>& row, int64_t dim, int64_t r, bool inter,
               const float* cos, const float* sin, int64_t p) {
  if (r == 0 || dim >= r) return row[dim];
  const int64_t i = inter ? dim / 2 : dim % (r / 2);
  const bool first = inter ? dim % 2 == 0 : dim < r / 2;
  const int64_t a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + r / 2;
  const double c = cos[p * (r / 2) + i], s = sin[p * (r / 2) + i];
  return first ? row[a] * c - row[b] * s : row[b] * c + row[a] * s;
}

struct AppendCase {
  int64_t tokens = 0, hkv = 1, hq = 1, d = 2, block = 8, blocks = 1, rotary_dim = 0;
  TensorBuf kc, vc, kn, vn, q;
  bool with_q = false;
  std::vector<int32_t> slots, pos;
  std::vector<float> table;
  RotaryEmbedding rot;
  // k_new, v_new and q rows before the call: [token][head][dim].
  std::vector<std::vector<float>> k_rows, v_rows, q_rows;
  std::string desc;
};

// New K, V and q: separate token-major tensors, or views of one fused
// [tokens, Hq + 2 Hkv, D] buffer (now and then with q shifted onto k's
// first element), or k_new inside k_cache's first page.
void MakeNewTokens(FuzzInput* in, DType tn, AppendCase* c) {
  const int64_t t_ext = std::max<int64_t>(c->tokens, 1), d = c->d;
  if (in->OneIn(3)) {
    const int64_t shape[4] = {1, c->hq + 2 * c->hkv, t_ext, d};
    const int perm[3] = {0, 2, 1};
    int64_t strides[4];
    LayoutStrides(shape, perm, 0, nullptr, strides);
    TensorBuf all = MakeTensor(tn, shape, strides, 0);
    FillValues(&all, in->Byte(), false);
    c->kn = c->vn = c->q = all;
    c->q.shape[1] = c->hq;
    c->kn.shape[1] = c->vn.shape[1] = c->hkv;
    c->kn.base += c->hq * d * DTypeSize(tn);
    c->vn.base += (c->hq + c->hkv) * d * DTypeSize(tn);
    if (in->OneIn(6)) c->q.base += DTypeSize(tn);
    c->desc += " fused";
  } else {
    c->kn = Stored(tn, 1, c->hkv, t_ext, d, true, 0);
    c->vn = Stored(tn, 1, c->hkv, t_ext, d, true, 0);
    c->q = Stored(tn, 1, c->hq, t_ext, d, true, 0);
    FillValues(&c->kn, in->Byte(), false);
    FillValues(&c->vn, in->Byte(), false);
    FillValues(&c->q, in->Byte(), false);
  }
  c->kn.shape[2] = c->vn.shape[2] = c->q.shape[2] = c->tokens;
  if (c->tokens <= c->block && in->OneIn(12)) {
    c->kn = c->kc;
    c->kn.shape[0] = 1;
    c->kn.shape[2] = c->tokens;
  }
}

void MakeAppendCase(FuzzInput* in, AppendCase* c) {
  c->tokens = in->Range(0, 10);
  c->hkv = in->Range(1, 3);
  c->hq = c->hkv * in->Range(1, 2);
  c->d = 2 * in->Range(1, 12);
  c->block = in->OneIn(16) ? 12 : 8 * in->Range(1, 2);
  c->blocks = in->Range(1, 5);
  const DType tk = TakeDType(in, false), tv = TakeDType(in, false), tn = TakeDType(in, false);
  const bool nhd = in->Bool(), rotary = in->Bool();
  c->with_q = rotary && in->Bool();
  c->kc = Stored(tk, c->blocks, c->hkv, c->block, c->d, nhd, 0x11);
  c->vc = Stored(tv, c->blocks, c->hkv, c->block, c->d, nhd, 0x22);
  c->desc = "T" + std::to_string(c->tokens) + " Hkv" + std::to_string(c->hkv) + " D" +
            std::to_string(c->d) + " block" + std::to_string(c->block);
  MakeNewTokens(in, tn, c);
  const int64_t slots = c->blocks * c->block;
  for (int64_t t = 0; t < c->tokens; ++t) {
    c->slots.push_back(static_cast<int32_t>(in->Range(-2, slots + (in->OneIn(16) ? 1 : -1))));
  }
  const int64_t max_pos = in->Range(1, 8);
  const int64_t r = in->OneIn(4) ? c->d + 2 : 2 * in->Range(0, c->d / 2);
  for (int64_t t = 0; t < c->tokens; ++t) c->pos.push_back(static_cast<int32_t>(in->Range(0, max_pos)));
  c->table.resize(static_cast<size_t>(max_pos * (c->d + 2)));
  for (size_t i = 0; i < c->table.size(); ++i) c->table[i] = std::cos(0.37f * static_cast<float>(i));
  if (rotary) {
    c->rot.positions = c->pos.data();
    c->rot.cos = c->table.data();
    c->rot.sin = c->table.data() + 1;
    c->rot.max_position = max_pos;
    c->rot.rotary_dim = r;
    c->rot.interleaved = in->Bool();
    c->rotary_dim = r == 0 ? c->d : r;
    c->desc += " rotary";
  }
  for (int64_t t = 0; t < c->tokens; ++t)
    for (int64_t h = 0; h < c->hq; ++h) {
      std::vector<float> kr(c->d), vr(c->d), qr(c->d);
      for (int64_t i = 0; i < c->d; ++i) {
        if (h < c->hkv) kr[i] = c->kn.Get(0, h, t, i), vr[i] = c->vn.Get(0, h, t, i);
        qr[i] = c->q.Get(0, h, t, i);
      }
      if (h < c->hkv) c->k_rows.push_back(kr), c->v_rows.push_back(vr);
      c->q_rows.push_back(qr);
    }
}

// After a successful AppendKv: each token's row in its slot, q rotated.
void CheckAppended(const AppendCase& c) {
  const RotaryEmbedding& rot = c.rot;
  for (int64_t t = 0; t < c.tokens; ++t) {
    const int64_t p = rot.positions != nullptr ? c.pos[t] : 0, slot = c.slots[t];
    for (int64_t h = 0; h < c.hkv && slot >= 0; ++h) {
      const size_t row = static_cast<size_t>(t * c.hkv + h);
      for (int64_t i = 0; i < c.d; ++i) {
        const double want_k = Rotated(c.k_rows[row], i, c.rotary_dim, rot.interleaved,
                                      rot.cos, rot.sin, p);
        if (!Close(c.kc.Get(slot / c.block, h, slot % c.block, i), want_k, c.kc.dtype) ||
            !Close(c.vc.Get(slot / c.block, h, slot % c.block, i), c.v_rows[row][i],
                   c.vc.dtype)) {
          Fail("cache row differs from the rotated, rounded input", c.desc);
        }
      }
    }
    for (int64_t h = 0; h < c.hq && c.with_q; ++h) {
      const std::vector<float>& qr = c.q_rows[static_cast<size_t>(t * c.hq + h)];
      for (int64_t i = 0; i < c.d; ++i) {
        const double want = Rotated(qr, i, c.rotary_dim, rot.interleaved, rot.cos, rot.sin, p);
        if (!Close(c.q.Get(0, h, t, i), want, c.q.dtype)) Fail("q row not rotated as asked", c.desc);
      }
    }
  }
}

void FuzzAppend(FuzzInput* in) {
  AppendCase c;
  MakeAppendCase(in, &c);
  Saved saved;
  for (const TensorBuf* t : {&c.kc, &c.vc, &c.kn, &c.vn, &c.q}) saved.Add(*t);
  const Status s = AppendKv(c.kn.View(), c.vn.View(), c.kc.Mutable(), c.vc.Mutable(),
                            c.tokens > 0 ? c.slots.data() : nullptr, c.rot,
                            c.with_q ? c.q.Mutable() : MutableTensorView());
  if (!s.ok()) {
    if (s.message.empty() || !saved.Unchanged()) Fail("failed AppendKv wrote: " + s.message, c.desc);
    return;
  }
  CheckAppended(c);
}

// ---------------------------------------------------------------- merge

// SEMANTICS.md's merge of one row in double: parts with LSE -inf add
// nothing; a NaN LSE makes the row NaN; a +inf one gives O NaN, LSE +inf.
void MergeRow(const std::vector<double>& lses, const std::vector<std::vector<double>>& rows,
              std::vector<double>* out, double* lse) {
  const size_t d = out->size();
  double m = -INFINITY;
  bool nan = false, pos_inf = false;
  for (double l : lses) {
    nan |= std::isnan(l);
    pos_inf |= l == INFINITY;
    if (l > m) m = l;
  }
  if (nan || pos_inf) {
    std::fill(out->begin(), out->end(), NAN);
    *lse = nan ? NAN : INFINITY;
    return;
  }
  std::fill(out->begin(), out->end(), 0.0);
  if (m == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  double z = 0;
  for (double l : lses) z += std::exp(l - m);
  *lse = m + std::log(z);
  for (size_t p = 0; p < lses.size(); ++p) {
    if (lses[p] == -INFINITY) continue;
    const double w = std::exp(lses[p] - *lse);
    for (size_t i = 0; i < d; ++i) (*out)[i] += w * rows[p][i];
  }
}

// x rounded to dtype t (f16 overflow gives Inf, as the library stores it).
double RoundTo(DType t, double x) {
  const float f = static_cast<float>(x);
  if (t == DType::kF16) return F16ToF32(F32ToF16(f));
  if (t == DType::kBF16) return BF16ToF32(F32ToBF16(f));
  return x;
}

bool SameOrClose(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol;
}

void FuzzMerge(FuzzInput* in) {
  const int64_t parts = in->Range(1, 4), b = in->Range(1, 2), h = in->Range(1, 3);
  const int64_t l = in->Range(1, 5), d = in->Range(1, 24);
  std::vector<TensorBuf> outs, lses;
  const float kLse[8] = {0.0f, 1.5f, -3.0f, 20.0f, -INFINITY, -INFINITY, NAN, INFINITY};
  double bound = 0;
  for (int64_t p = 0; p < parts; ++p) {
    const DType t = TakeDType(in, in->OneIn(16));
    outs.push_back(Stored(t, b, h, l, d, in->Bool(), 0, 4));  // room for a shifted view
    FillValues(&outs.back(), in->Byte(), in->OneIn(8));
    lses.push_back(Stored(DType::kF32, b, h, l, 1, false, 0));
    for (int64_t i = 0; i < b * h * l; ++i) {
      const float x = in->OneIn(3) ? kLse[in->Range(0, 7)] : in->Range(-64, 64) / 16.0f;
      lses.back().Set(i / (h * l), i / l % h, i % l, 0, x);
    }
    bound = std::max(bound, BoundOf(t));
  }
  const DType to = TakeDType(in, false);
  bound = std::max(bound, BoundOf(to));
  const int64_t alias = in->Range(0, 5);  // 1: out is outs[0]; 2: lse is lses[0]; 3: overlap
  TensorBuf out = alias == 1 && outs[0].dtype == to ? outs[0] : Stored(to, b, h, l, d, in->Bool(), 0xA5);
  TensorBuf lse = alias == 2 ? lses[0] : Stored(DType::kF32, b, h, l, 1, false, 0x5A);
  if (alias == 3) out = outs[parts - 1], out.base += DTypeSize(out.dtype);
  const bool with_lse = in->Bool() || alias == 2;
  // The expected result, from the inputs before the call.
  std::vector<std::vector<double>> want_o(static_cast<size_t>(b * h * l));
  std::vector<double> want_lse(want_o.size());
  for (int64_t r = 0; r < b * h * l; ++r) {
    const int64_t i0 = r / (h * l), i1 = r / l % h, i2 = r % l;
    std::vector<double> ls;
    std::vector<std::vector<double>> rows;
    for (int64_t p = 0; p < parts; ++p) {
      ls.push_back(lses[p].Get(i0, i1, i2, 0));
      rows.emplace_back();
      for (int64_t i = 0; i < d; ++i) rows.back().push_back(outs[p].Get(i0, i1, i2, i));
    }
    want_o[r].resize(static_cast<size_t>(d));
    MergeRow(ls, rows, &want_o[r], &want_lse[r]);
  }
  Saved saved;
  for (const auto* v : {&outs, &lses}) for (const TensorBuf& t : *v) saved.Add(t);
  saved.Add(out);
  saved.Add(lse);
  Verbose("merge: " + std::to_string(parts) + " parts, alias " + std::to_string(alias) + "\n  " +
          Describe("out", out) + "\n  " + Describe("outs[last]", outs[parts - 1]));
  std::vector<TensorView> out_views, lse_views;
  for (int64_t p = 0; p < parts; ++p) out_views.push_back(outs[p].View()), lse_views.push_back(lses[p].View());
  const Status s = MergeStates(out_views.data(), lse_views.data(), parts, out.Mutable(),
                               with_lse ? lse.Mutable() : MutableTensorView());
  const std::string desc = std::to_string(parts) + " parts, alias " + std::to_string(alias);
  if (!s.ok()) {
    if (s.message.empty() || !saved.Unchanged()) Fail("failed MergeStates wrote: " + s.message, desc);
    if (alias == 3 && s.message.find("overlaps input outs") != std::string::npos &&
        !ShareBytes(out, outs[parts - 1])) {
      Fail("rejected an output that shares no byte with a part: " + s.message, desc);
    }
    return;
  }
  if (alias == 3 && ShareBytes(out, outs[parts - 1])) Fail("accepted an output overlapping a part", desc);
  for (int64_t r = 0; r < b * h * l; ++r) {
    const int64_t i0 = r / (h * l), i1 = r / l % h, i2 = r % l;
    double max_row = 1;
    for (double x : want_o[r]) max_row = std::max(max_row, std::isfinite(x) ? std::fabs(x) : 0.0);
    for (int64_t i = 0; i < d; ++i) {
      const double want = std::isfinite(want_o[r][i]) && std::isinf(RoundTo(to, want_o[r][i]))
                              ? RoundTo(to, want_o[r][i])  // beyond the output type's range
                              : want_o[r][i];
      if (!SameOrClose(out.Get(i0, i1, i2, i), want, bound * max_row * 2)) {
        Fail("merged O " + std::to_string(out.Get(i0, i1, i2, i)) + " but the double merge gives " +
                 std::to_string(want_o[r][i]) + " (row " + std::to_string(r) + ", LSE " +
                 std::to_string(lses[0].Get(i0, i1, i2, 0)) + ")", desc);
      }
    }
    if (with_lse && !SameOrClose(lse.Get(i0, i1, i2, 0), want_lse[r], 1e-4 * std::max(1.0, std::fabs(want_lse[r])))) {
      Fail("merged LSE off the double merge", desc);
    }
  }
}

// ---------------------------------------------------------------- paged

struct PagedCase {
  int64_t seqs = 1, hq = 1, hkv = 1, d = 8, block = 8, max_blocks = 1, total_q = 0;
  std::vector<int32_t> lq, lk, cu, table;
  TensorBuf q, kc, vc, o, lse;
  AttentionOptions options;
  std::vector<float> sinks;
  std::string desc;
};

void MakePagedCase(FuzzInput* in, PagedCase* c) {
  c->seqs = in->Range(1, 4);
  c->hkv = in->Range(1, 2);
  c->hq = c->hkv * in->Range(1, 2);
  c->d = in->Range(1, 24);
  c->block = 8 * in->Range(1, 2);
  c->cu.push_back(0);
  for (int64_t s = 0; s < c->seqs; ++s) {
    c->lq.push_back(static_cast<int32_t>(in->Range(0, 6)));
    c->lk.push_back(static_cast<int32_t>(in->Range(0, 40)));
    c->cu.push_back(c->cu.back() + c->lq.back());
    c->max_blocks = std::max<int64_t>(c->max_blocks, (c->lk.back() + c->block - 1) / c->block);
  }
  c->total_q = c->cu.back();
  const int64_t pages = c->seqs * c->max_blocks + 1;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[in->Range(0, static_cast<int64_t>(i) - 1)]);
  c->table.assign(order.begin(), order.begin() + c->seqs * c->max_blocks);
  if (in->OneIn(16)) c->table[0] = static_cast<int32_t>(pages);  // a page out of range
  const DType tq = TakeDType(in, false), tkv = TakeDType(in, false), to = TakeDType(in, false);
  const bool nhd = in->Bool();
  c->q = Stored(tq, 1, c->hq, std::max<int64_t>(c->total_q, 1), c->d, true, 0);
  c->kc = Stored(tkv, pages, c->hkv, c->block, c->d, nhd, 0);
  c->vc = Stored(tkv, pages, c->hkv, c->block, c->d, nhd, 0);
  c->o = Stored(to, 1, c->hq, std::max<int64_t>(c->total_q, 1), c->d, true, 0xA5);
  c->lse = Stored(DType::kF32, 1, c->hq, std::max<int64_t>(c->total_q, 1), 1, false, 0x5A);
  const uint32_t seed = in->Byte();
  FillValues(&c->q, seed, false);
  FillValues(&c->kc, seed + 1, false);
  FillValues(&c->vc, seed + 2, false);
  c->q.shape[2] = c->o.shape[2] = c->lse.shape[2] = c->total_q;
  c->options.causal = in->Bool();
  if (in->OneIn(3)) c->options.alignment = in->Bool() ? Alignment::kTopLeft : Alignment::kBottomRight;
  c->options.window_left = in->OneIn(3) ? in->Range(0, 10) : -1;
  c->options.softcap = in->OneIn(4) ? 10.0f : 0.0f;
  if (in->OneIn(4)) {
    c->sinks.assign(static_cast<size_t>(c->hq), 0.75f);
    c->options.sinks = c->sinks.data();
  }
  c->desc = std::to_string(c->seqs) + " seqs, Hq" + std::to_string(c->hq) + " Hkv" +
            std::to_string(c->hkv) + " D" + std::to_string(c->d) + " block" +
            std::to_string(c->block) + (nhd ? " NHD" : " HND");
}

// Sequence s against ReferenceAttention on its pages gathered into dense
// K/V, as batch entry 0 of a call with Lq = its queries.
void CheckSequence(const PagedCase& c, int64_t s, double bound) {
  const int64_t lq = c.lq[s], lk = c.lk[s], first = c.cu[s];
  if (lq == 0) return;
  const int64_t dense_shape[4] = {1, c.hkv, std::max<int64_t>(lk, 1), c.d};
  const int64_t q_shape[4] = {1, c.hq, lq, c.d};
  const int perm[3] = {0, 1, 2};
  int64_t strides[4], q_strides[4];
  LayoutStrides(dense_shape, perm, 0, nullptr, strides);
  LayoutStrides(q_shape, perm, 0, nullptr, q_strides);
  TensorBuf k = MakeTensor(c.kc.dtype, dense_shape, strides, 0);
  TensorBuf v = MakeTensor(c.kc.dtype, dense_shape, strides, 0);
  TensorBuf q = MakeTensor(c.q.dtype, q_shape, q_strides, 0);
  for (int64_t h = 0; h < c.hkv; ++h)
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t page = c.table[static_cast<size_t>(s * c.max_blocks + j / c.block)];
      for (int64_t i = 0; i < c.d; ++i) {
        k.Set(0, h, j, i, c.kc.Get(page, h, j % c.block, i));
        v.Set(0, h, j, i, c.vc.Get(page, h, j % c.block, i));
      }
    }
  for (int64_t h = 0; h < c.hq; ++h)
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t x = 0; x < c.d; ++x) q.Set(0, h, i, x, c.q.Get(0, h, first + i, x));
  k.shape[2] = v.shape[2] = lk;
  AttentionOptions opt = c.options;
  if (!opt.alignment.has_value()) opt.alignment = Alignment::kBottomRight;
  std::vector<double> o_ref, lse_ref;
  if (lk == 0) {  // no keys: O = 0, LSE = the sink or -inf
    o_ref.assign(static_cast<size_t>(c.hq * lq * c.d), 0.0);
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < lq; ++i) lse_ref.push_back(c.sinks.empty() ? -INFINITY : c.sinks[h]);
  } else {
    const Status r = ReferenceAttention(q.View(), k.View(), v.View(), opt, &o_ref, &lse_ref);
    if (!r.ok()) Fail("reference rejects sequence " + std::to_string(s) + ": " + r.message, c.desc);
  }
  const bool f32_qk = c.q.dtype == DType::kF32 && c.kc.dtype == DType::kF32;
  size_t n = 0;
  for (int64_t h = 0; h < c.hq; ++h)
    for (int64_t i = 0; i < lq; ++i) {
      for (int64_t x = 0; x < c.d; ++x, ++n) {
        if (!(std::fabs(c.o.Get(0, h, first + i, x) - o_ref[n]) <= bound)) {
          Fail("O of sequence " + std::to_string(s) + " off the reference", c.desc);
        }
      }
      const double want = lse_ref[static_cast<size_t>(h * lq + i)];
      if (!SameOrClose(c.lse.Get(0, h, first + i, 0), want, f32_qk ? 1e-4 : 1e-2)) {
        Fail("LSE of sequence " + std::to_string(s) + " off the reference", c.desc);
      }
    }
}

void FuzzPaged(FuzzInput* in) {
  PagedCase c;
  MakePagedCase(in, &c);
  PagedKvCache cache;
  cache.k = c.kc.View();
  cache.v = c.vc.View();
  cache.block_table = c.table.data();
  cache.max_blocks_per_seq = c.max_blocks;
  cache.kv_lens = c.lk.data();
  Saved saved;
  for (const TensorBuf* t : {&c.q, &c.kc, &c.vc, &c.o, &c.lse}) saved.Add(*t);
  const bool one_each = in->OneIn(8);
  const Status s = PagedAttention(c.q.View(), cache, c.seqs, one_each ? nullptr : c.cu.data(),
                                  c.o.Mutable(), c.options, c.lse.Mutable());
  if (!s.ok()) {
    if (s.message.empty() || !saved.Unchanged()) Fail("failed PagedAttention wrote: " + s.message, c.desc);
    return;
  }
  if (one_each) return;  // accepted only when every sequence has one query: checked below otherwise
  double bound = 0;
  for (DType t : {c.q.dtype, c.kc.dtype, c.o.dtype}) bound = std::max(bound, BoundOf(t));
  for (int64_t seq = 0; seq < c.seqs; ++seq) CheckSequence(c, seq, bound);
}

}  // namespace
}  // namespace fuzz
}  // namespace simdattn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  simdattn::fuzz::FuzzInput in(data, size);
  switch (in.Byte() % 3) {
    case 0:
      simdattn::fuzz::FuzzAppend(&in);
      break;
    case 1:
      simdattn::fuzz::FuzzMerge(&in);
      break;
    default:
      simdattn::fuzz::FuzzPaged(&in);
      break;
  }
  return 0;
}
