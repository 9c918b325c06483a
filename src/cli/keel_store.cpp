// keel-store: the rendezvous store in a process of its own (c10d's
// TCPStore server), for jobs that torchrun's agent does not start. With it
// no training rank hosts the store, so any rank, rank 0 included, may die
// and the others re-form (keel/v1/comm.h: rendezvous
// "tcp://HOST:PORT?store=external").
//
//   keel-store --port P [--lifetime-s S]
//
// Prints "keel-store: serving on port P" once it accepts connections (with
// --port 0, the port the system chose), then serves until SIGTERM or SIGINT,
// or for S seconds at most. Exit status: 0 on a signal or at the end of
// the lifetime, 1 when it cannot serve, 2 for a usage error.
#include <csignal>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iostream>
#include <string>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace {

int usage(const std::string& why) {
  std::cerr << "keel-store: " << why << "\nusage: keel-store --port P [--lifetime-s S]\n";
  return 2;
}

bool parse_int(const std::string& text, long min, long max, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long port = -1;
  long lifetime_s = 0;  // 0: until a signal
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--port") {
      if (!parse_int(value, 0, 65535, &port)) return usage("bad --port '" + value + "'");
    } else if (flag == "--lifetime-s") {
      if (!parse_int(value, 1, 30L * 24 * 3600, &lifetime_s)) {
        return usage("bad --lifetime-s '" + value + "'");
      }
    } else {
      return usage("unknown flag '" + flag + "'");
    }
  }
  if (port < 0) return usage("--port is required");

  // Blocked before the server's threads start, so that they inherit the
  // mask and the signals reach sigtimedwait below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;
    store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    std::cerr << "keel-store: cannot serve on port " << port << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << "keel-store: serving on port " << store->getPort() << std::endl;

  timespec wait{};
  wait.tv_sec = lifetime_s > 0 ? lifetime_s : 365L * 24 * 3600;
  while (true) {
    const int got = sigtimedwait(&stop, nullptr, &wait);
    if (got == SIGTERM || got == SIGINT || (got < 0 && errno == EAGAIN)) break;
  }
  std::cout << "keel-store: stopped" << std::endl;
  return 0;
}
