// `simdattn mha`: the multi-head attention layer on .npy activations with
// weights from a .npz, for the command-line tool (tools/main.cc).

#ifndef SIMDATTN_TOOLS_MHA_COMMAND_H_
#define SIMDATTN_TOOLS_MHA_COMMAND_H_

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace simdattn {

struct MhaArgs {
  std::string weights, x, kv_source, out;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false, seq_first = false;
  int threads = 0;
};

// Adds the subcommand and its options to app.
CLI::App* AddMhaCommand(CLI::App* app, MhaArgs* args);

// Runs it: 0 on success, 2 (with a message on stderr) on any input or
// library error.
int RunMha(const MhaArgs& args);

}  // namespace simdattn

#endif  // SIMDATTN_TOOLS_MHA_COMMAND_H_
