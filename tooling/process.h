// Starting a child process, once for keel's tools, examples, benchmarks and
// tests (keel-compat's rank workers, the multi-process tests, tiny_lm's
// ranks, keel-serve-load's server): posix_spawn with this process's
// environment, stdout optionally into a file (stderr with it). Header-only
// and never installed; it depends on nothing of keel's.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>

#include <string>
#include <vector>

extern char** environ;

namespace keel::tooling {

struct SpawnOptions {
  // The child's stdout: this process's when empty, else this file, created
  // or truncated (mode 0644).
  std::string stdout_path;
  // Whether the child's stderr goes where its stdout goes.
  bool stderr_to_stdout = false;
  // Whether `program` is looked up on PATH (posix_spawnp) when it has no slash.
  bool search_path = false;
};

// What spawn() did: the child's pid, or -1 and the error number.
struct Spawned {
  pid_t pid = -1;
  int error = 0;
  explicit operator bool() const { return pid > 0; }
};

// Starts `program` with the argument list `args` (args[0] is the child's
// argv[0]) and this process's environment.
inline Spawned spawn(const std::string& program, std::vector<std::string> args,
                     const SpawnOptions& options = {}) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, options.stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  if (options.stderr_to_stdout) posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Spawned s;
  const int rc =
      options.search_path
          ? posix_spawnp(&s.pid, program.c_str(), &actions, nullptr, argv.data(), environ)
          : posix_spawn(&s.pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) s = Spawned{-1, rc};
  return s;
}

}  // namespace keel::tooling
