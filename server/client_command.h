#ifndef KVD_SERVER_CLIENT_COMMAND_H_
#define KVD_SERVER_CLIENT_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

namespace kvd {

// `kvd client --address HOST:PORT (--prompt TEXT | --prompt-token-ids 1,2,3) [flags]`, the
// flags one per GenerateRequest field (kvd client --help lists them; --stop may repeat).
// Streams one completion from a running `kvd serve` to `out` as the text deltas arrive
// (the prompt is not repeated), then a newline if anything was printed; with --prompt-token-ids
// (for models without a tokenizer) the generated token ids are printed instead, space-separated.
// --usage adds one line of the request id, usage and timings to `err`.
// `kvd client --address HOST:PORT --close-session ID` calls CloseSession instead and prints
// nothing on success. Returns 0 on success, 1 when the call fails (the gRPC status code and
// message on `err`), 2 for bad flags.
int RunClientCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kvd

#endif  // KVD_SERVER_CLIENT_COMMAND_H_
