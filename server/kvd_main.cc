// kvd: the command-line entry point: the daemon (`serve`) and the offline tools.

#include <iostream>
#include <string>
#include <vector>

#include "server/client_command.h"
#include "server/serve_command.h"
#include "tools/bench_command.h"
#include "tools/device.h"
#include "tools/estimate_command.h"
#include "tools/generate_command.h"

namespace {

constexpr char kUsage[] =
    "kvd — a KV-cache-centric Llama serving engine\n"
    "\n"
    "usage: kvd <command> [flags]\n"
    "\n"
    "commands:\n"
    "  serve      run the daemon: gRPC API, health, reflection and /metrics\n"
    "  client     stream a completion from a running daemon\n"
    "  generate   complete one prompt in this process and print the text (on CUDA where\n"
    "             the GPU can run the model, else on the CPU; --device picks)\n"
    "  estimate   KV-cache memory for a model and workload (capacity planning)\n"
    "  bench      time decode steps of the whole engine on a synthetic model or a\n"
    "             checkpoint, beside the memory roofline (on CUDA where the GPU can run\n"
    "             the model, else on the CPU; --device picks)\n"
    "\n"
    "`kvd <command> --help` describes a command's flags; `kvd --version` prints the\n"
    "version and whether this build has the CUDA backend.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (command == "--version" || command == "version") {
    std::cout << "kvd " << KVD_VERSION << " ("
              << (kvd::BuiltWithCuda() ? "CUDA and CPU backends"
                                       : "CPU backend only; built without CUDA")
              << ")\n";
    return 0;
  }
  if (command == "serve") return kvd::RunServeCommand(args, std::cout, std::cerr);
  if (command == "client") return kvd::RunClientCommand(args, std::cout, std::cerr);
  if (command == "generate") return kvd::RunGenerateCommand(args, std::cout, std::cerr);
  if (command == "estimate") return kvd::RunEstimateCommand(args, std::cout, std::cerr);
  if (command == "bench") return kvd::RunBenchCommand(args, std::cout, std::cerr);
  std::cerr << "kvd: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
