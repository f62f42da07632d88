#ifndef KVD_TOOLS_ESTIMATE_COMMAND_H_
#define KVD_TOOLS_ESTIMATE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

namespace kvd {

// `kvd estimate`: KV memory of a batch for a model (checkpoint header or synthetic preset;
// no weights are loaded), exact beside the seeds' d_model formula, and how many sequences
// fit a budget. Returns the process exit code; errors go to `err`.
int RunEstimateCommand(const std::vector<std::string>& args, std::ostream& out,
                       std::ostream& err);

}  // namespace kvd

#endif  // KVD_TOOLS_ESTIMATE_COMMAND_H_
