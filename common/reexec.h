// Starting the program again with the same arguments, for settings a library reads only as the
// process starts (glibc's tunables, OpenBLAS's core type, libgomp's spin count): the caller sets
// the environment variable, then calls ReexecSelf. Header only, so that the kernels-only build
// (which has no common/ library) can use it too.
#ifndef LLM_COMMON_REEXEC_H_
#define LLM_COMMON_REEXEC_H_

#include <unistd.h>

namespace llm {

// Replaces the process by a fresh start of its own binary with `argv`, keeping the environment.
// It execs the binary's path as /proc/self/exe links to it, not /proc/self/exe itself: the
// process keeps its name (comm, as ps and pgrep show it, and as tests find processes by), where
// an exec of /proc/self/exe would be named "exe". Returns only if that failed; the caller then
// runs on without its setting (and says so).
inline void ReexecSelf(char** argv) {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = '\0';
  execv(path, argv);
}

}  // namespace llm

#endif  // LLM_COMMON_REEXEC_H_
