#ifndef KVD_TOOLS_BENCH_COMMAND_H_
#define KVD_TOOLS_BENCH_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

namespace kvd {

// `kvd bench`: the time per greedy decode step of the whole engine path on a synthetic model
// (on CUDA where the GPU can run the model, else on the CPU; --device picks), with and without
// CUDA graphs, beside the memory roofline of the same run (bench_command.cc). Returns the process
// exit code: 2 on a usage error, 1 when a measurement fails; the table goes to `out`, errors
// to `err`.
int RunBenchCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kvd

#endif  // KVD_TOOLS_BENCH_COMMAND_H_
