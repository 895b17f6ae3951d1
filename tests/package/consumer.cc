// Embeds the installed simdattn: the worked example of SEMANTICS.md.
#include <cmath>
#include <cstdio>

#include <simdattn/attention.h>

int main() {
  const float q[1] = {1.0f};
  const float k[2] = {0.0f, std::log(3.0f)};  // weights 1/4 and 3/4
  const float v[4] = {2.0f, 0.0f, 0.0f, 4.0f};
  float o[2] = {0.0f, 0.0f};
  simdattn::AttentionOptions options;
  options.scale = 1.0f;
  simdattn::RunInfo info;
  const simdattn::Status s = simdattn::Attention(
      simdattn::MakeBHSD(q, simdattn::DType::kF32, 1, 1, 1, 1),
      simdattn::MakeBHSD(k, simdattn::DType::kF32, 1, 1, 2, 1),
      simdattn::MakeBHSD(v, simdattn::DType::kF32, 1, 1, 2, 2),
      simdattn::MakeBHSD(o, simdattn::DType::kF32, 1, 1, 1, 2), options, {},
      {}, &info);
  if (!s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.message.c_str());
    return 1;
  }
  std::printf("consumer: O = [%g, %g] on %s\n", o[0], o[1], info.target);
  return std::fabs(o[0] - 0.5f) < 1e-5f && std::fabs(o[1] - 3.0f) < 1e-5f ? 0 : 1;
}
