#ifndef KVD_CACHE_CACHE_CHECK_H_
#define KVD_CACHE_CACHE_CHECK_H_

#include <cstdio>
#include <cstdlib>

// KVD_CACHE_CHECK(cond, msg): a broken invariant or a violated `REQUIRES:` in cache/ aborts
// with the file, line, condition and message. Enabled in every build type (invariant checks
// are part of the contract, see the top-level CMakeLists.txt).
#define KVD_CACHE_CHECK(cond, msg)                                                             \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, (msg)); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (false)

#endif  // KVD_CACHE_CACHE_CHECK_H_
