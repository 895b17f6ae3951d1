// The project's dispatch table: every code path compiled in, in order of
// preference, with its CPU check, its name, and the cap that selects one.

#ifndef SIMDATTN_LIB_DISPATCH_H_
#define SIMDATTN_LIB_DISPATCH_H_

#include <string>
#include <vector>

#include "lib/kernels/kernels.h"
#include "simdattn/attention.h"

namespace simdattn {

struct TargetEntry {
  const char* name;         // e.g. "AVX3_DL"
  int rank;                 // 0 = most preferred
  bool supported;           // this CPU can run it
  // Chosen without being named: false for an entry that this CPU runs
  // slower than the next one (AVX3_BF16 on Intel, see dispatch.cc); a cap
  // naming it exactly still selects it.
  bool preferred;
  const TargetKernels* kernels;
};

// Compiled entries, best first (built once).
const std::vector<TargetEntry>& TargetTable();

// Tests only, before any call: the AVX3_AMX entry runs the tile emulator
// (amx_tiles.h) and is available on every CPU with AVX3, so that its
// kernel runs where the CPU has no AMX; off, the tile instructions.
void SetAmxEmulation(bool on);

// The entry a call runs: the best supported one not ranked above the cap
// (call_cap, the call's ExecutionOptions::max_target, when not null or "";
// else SetMaxTarget's; else the SIMDATTN_MAX_TARGET environment variable,
// whose bad value only the first call to see it reports), skipping entries
// that are not preferred unless the cap names them.
Status ChooseTarget(const char* call_cap, const TargetEntry** entry);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_DISPATCH_H_
