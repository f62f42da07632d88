#ifndef KVD_TESTS_TOOLS_RUN_KVD_H_
#define KVD_TESTS_TOOLS_RUN_KVD_H_

// Runs the real `kvd` binary (KVD_BINARY) as a user would, capturing its output.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace kvd {

struct KvdResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

inline KvdResult RunKvd(const std::string& args) {
  KvdResult r;
  FILE* pipe = popen((std::string(KVD_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kvd

#endif  // KVD_TESTS_TOOLS_RUN_KVD_H_
