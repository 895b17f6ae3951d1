// Reader for NumPy .npz files (a zip archive of .npy members, as
// numpy.savez and numpy.savez_compressed write them), for the simdattn
// command-line tool: stored and deflated members, zip64 extra fields.

#ifndef SIMDATTN_TOOLS_NPZ_H_
#define SIMDATTN_TOOLS_NPZ_H_

#include <map>
#include <string>

#include "tools/npy.h"

namespace simdattn {
namespace npz {

// Reads every member of `path` into *out, keyed by its name without the
// ".npy" suffix. Returns false and sets *error (naming the file and the
// member) for a missing or truncated file, no end-of-central-directory
// record, a zip64 archive directory (more than 65535 members or 4 GiB of
// headers), an encrypted member, a method other than stored (0) or deflate
// (8), a CRC or size mismatch, or a member that is not a valid .npy.
// Never throws.
bool Read(const std::string& path, std::map<std::string, npy::Array>* out, std::string* error);

}  // namespace npz
}  // namespace simdattn

#endif  // SIMDATTN_TOOLS_NPZ_H_
