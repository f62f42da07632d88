#ifndef KVD_TOOLS_GENERATE_COMMAND_H_
#define KVD_TOOLS_GENERATE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

namespace kvd {

// `kvd generate`: completes one prompt on the CPU engine and prints the completion (or
// one JSON object with --json). Returns the process exit code; errors go to `err`.
int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out,
                       std::ostream& err);

}  // namespace kvd

#endif  // KVD_TOOLS_GENERATE_COMMAND_H_
