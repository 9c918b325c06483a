#include "suite/rank_workers.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <utility>

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "engine/peak_memory.h"
#include "engine/safetensors.h"
#include "keel/v1/comm.h"
#include "process.h"

namespace keel::harness {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr int kDefaultWorld = 2;
// A rank's own bound on rendezvous and on each collective: it fails by
// itself, with keel's message, well before the parent's deadline kills it.
constexpr Millis kWorkerTimeout{20000};
// What a rank's exit status means to the parent.
constexpr int kWorkerOk = 0;
constexpr int kWorkerFailed = 1;
constexpr int kWorkerUsage = 2;
constexpr int kWorkerUnsupported = 3;

CommLaunch& launch_settings() {
  static CommLaunch settings;
  return settings;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string self_executable() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : path.string();
}

// The last lines of a rank's log, for an error message.
std::string log_tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  constexpr std::size_t kMax = 600;
  if (text.size() > kMax) text = "..." + text.substr(text.size() - kMax);
  return text.empty() ? "(no output)" : text;
}

// A temporary directory that removes itself.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "keel-compat-ranks-XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Worker {
  pid_t pid = -1;
  std::string log, inputs, out;
  bool done = false;
  int status = -1;  // exit code, or 128 + signal
};

// Kills and reaps every rank still running.
void kill_all(std::vector<Worker>& workers) {
  for (Worker& w : workers) {
    if (w.pid > 0 && !w.done) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
      w.done = true;
      w.status = 128 + SIGKILL;
    }
  }
}

result<void> spawn(Worker& w, const std::string& exe, std::vector<std::string> args) {
  tooling::SpawnOptions logged;
  logged.stdout_path = w.log;
  logged.stderr_to_stdout = true;
  const tooling::Spawned spawned = tooling::spawn(exe, std::move(args), logged);
  w.pid = spawned.pid;
  if (spawned) return success();
  return Error(Errc::io_error,
               absl::StrCat("cannot start worker '", exe, "': ", std::strerror(spawned.error)));
}

// Waits for every rank, bounded. A rank that fails leaves its peers
// waiting for it, so the first failure ends the case at once.
result<void> wait_all(const Case& c, std::vector<Worker>& workers, const CommLaunch& settings) {
  const auto deadline = Clock::now() + settings.timeout;
  const int ranks = static_cast<int>(workers.size());
  while (true) {
    bool all = true;
    int failed = -1;
    for (int r = 0; r < ranks; ++r) {
      Worker& w = workers[r];
      if (!w.done) {
        int status = 0;
        if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
          w.done = true;
          w.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
      }
      if (!w.done) all = false;
      if (w.done && w.status != kWorkerOk && failed < 0) failed = r;
    }
    if (failed >= 0) {
      kill_all(workers);
      const Worker& w = workers[failed];
      const std::string why =
          absl::StrCat(c.operation, ": case ", c.id, ": rank ", failed, " ",
                       w.status >= 128 ? absl::StrCat("died of signal ", w.status - 128)
                                       : absl::StrCat("exited with status ", w.status),
                       ": ", log_tail(w.log));
      return Error(w.status == kWorkerUnsupported ? Errc::unsupported : Errc::backend_error, why);
    }
    if (all) return success();
    if (Clock::now() >= deadline) {
      std::vector<int> late;
      for (int r = 0; r < ranks; ++r) {
        if (!workers[r].done) late.push_back(r);
      }
      kill_all(workers);
      return Error(Errc::timeout,
                   absl::StrCat(c.operation, ": case ", c.id, ": rank ",
                                absl::StrJoin(late, " and "), " did not finish within ",
                                settings.timeout.count(), " ms and was killed; rank ", late.front(),
                                "'s log: ", log_tail(workers[late.front()].log)));
    }
    std::this_thread::sleep_for(Millis(5));
  }
}

}  // namespace

void set_comm_launch(const CommLaunch& launch) {
  launch_settings() = launch;
}

CommLaunch comm_launch() {
  return launch_settings();
}

result<std::vector<RankRun>> run_on_ranks(
    const Case& c, const std::vector<std::map<std::string, at::Tensor>>& inputs, Backend backend) {
  const int ranks = static_cast<int>(inputs.size());
  const CommLaunch settings = launch_settings();
  ScratchDir dir;
  if (dir.path().empty()) {
    return Error(Errc::io_error,
                 absl::StrCat(c.operation, ": cannot make a scratch directory for the ranks"));
  }
  const int port = free_port();
  if (port == 0) {
    return Error(Errc::io_error,
                 absl::StrCat(c.operation, ": no free loopback port for the ranks"));
  }
  const std::string exe = settings.executable.empty() ? self_executable() : settings.executable;

  std::vector<Worker> workers(inputs.size());
  for (int r = 0; r < ranks; ++r) {
    Worker& w = workers[r];
    const std::string base = (std::filesystem::path(dir.path()) / absl::StrCat("rank", r)).string();
    w.log = base + ".log";
    w.inputs = base + ".in.safetensors";
    w.out = base + ".out.safetensors";
    TensorFile in;
    in.tensors = inputs[r];
    in.metadata["case"] = c.id;
    in.metadata["operation"] = c.operation;
    in.metadata["dtype"] = c.dtype;
    in.metadata["options"] = c.options.dump();
    if (auto written = write_safetensors(w.inputs, in); !written) return written.error();
  }
  for (int r = 0; r < ranks; ++r) {
    Worker& w = workers[r];
    std::vector<std::string> args{exe,        "comm-worker",
                                  "--case",   c.id,
                                  "--rank",   std::to_string(r),
                                  "--world",  std::to_string(ranks),
                                  "--port",   std::to_string(port),
                                  "--inputs", w.inputs,
                                  "--out",    w.out};
    if (backend != Backend::unset) {
      args.emplace_back("--backend");
      args.emplace_back(to_string(backend));
    }
    if (auto started = spawn(w, exe, std::move(args)); !started) {
      kill_all(workers);
      return Error(Errc::io_error, absl::StrCat(c.operation, ": case ", c.id, ": rank ", r, ": ",
                                                started.error().message()));
    }
  }
  if (auto waited = wait_all(c, workers, settings); !waited) return waited.error();

  std::vector<RankRun> runs(inputs.size());
  for (int r = 0; r < ranks; ++r) {
    result<TensorFile> out = read_safetensors(workers[r].out);
    if (!out) {
      return Error(out.error().code(), absl::StrCat(c.operation, ": case ", c.id, ": rank ", r,
                                                    "'s output: ", out.error().message()));
    }
    RankRun& run = runs[r];
    run.outputs = std::move(out.value().tensors);
    const auto& meta = out.value().metadata;
    if (auto m = meta.find("ms"); m != meta.end()) (void)absl::SimpleAtod(m->second, &run.ms);
    if (auto m = meta.find("peak_bytes"); m != meta.end())
      (void)absl::SimpleAtoi(m->second, &run.peak_bytes);
    if (auto m = meta.find("adapter"); m != meta.end()) run.adapter = m->second;
  }
  return runs;
}

int comm_worker_main(const std::vector<std::string>& args) {
  std::string id, inputs, out, backend_text;
  int rank = -1, port = 0, world = kDefaultWorld;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size()) {
      std::cerr << "keel-compat comm-worker: " << flag << " needs a value\n";
      return kWorkerUsage;
    }
    const std::string& value = args[++i];
    bool ok = true;
    if (flag == "--case") {
      id = value;
    } else if (flag == "--rank") {
      ok = absl::SimpleAtoi(value, &rank) && rank >= 0;
    } else if (flag == "--world") {
      ok = absl::SimpleAtoi(value, &world) && world >= 1 && world <= 64;
    } else if (flag == "--port") {
      ok = absl::SimpleAtoi(value, &port) && port > 0 && port < 65536;
    } else if (flag == "--inputs") {
      inputs = value;
    } else if (flag == "--out") {
      out = value;
    } else if (flag == "--backend") {
      backend_text = value;
    } else {
      std::cerr << "keel-compat comm-worker: unknown flag '" << flag << "'\n";
      return kWorkerUsage;
    }
    if (!ok) {
      std::cerr << "keel-compat comm-worker: bad value '" << value << "' for " << flag << "\n";
      return kWorkerUsage;
    }
  }
  if (id.empty() || rank < 0 || rank >= world || port == 0 || inputs.empty() || out.empty()) {
    std::cerr << "keel-compat comm-worker: expected --case ID --rank R --port P --inputs FILE "
                 "--out FILE [--world N] [--backend auto|compat|native], with R < N\n";
    return kWorkerUsage;
  }
  const auto fail = [&](const Error& e) {
    std::cerr << "keel-compat comm-worker: case " << id << ", rank " << rank << ": "
              << e.to_string() << "\n";
    return e.code() == Errc::unsupported ? kWorkerUnsupported : kWorkerFailed;
  };
  Backend backend = Backend::unset;
  if (!backend_text.empty()) {
    result<Backend> parsed = parse_backend(backend_text);
    if (!parsed) return fail(parsed.error());
    backend = parsed.value();
  }
  result<TensorFile> in = read_safetensors(inputs);
  if (!in) return fail(in.error());
  const auto& meta = in.value().metadata;
  Case c;
  c.id = id;
  if (auto m = meta.find("operation"); m != meta.end()) c.operation = m->second;
  if (auto m = meta.find("dtype"); m != meta.end()) c.dtype = m->second;
  if (auto m = meta.find("options"); m != meta.end()) {
    c.options = nlohmann::json::parse(m->second, nullptr, false);
  }
  c.inputs = std::move(in.value().tensors);
  const Family* family = find_family(c.operation);
  if (family == nullptr || !c.options.is_object()) {
    return fail(Error(Errc::corrupt_data,
                      absl::StrCat("comm-worker: '", inputs, "' names no known operation ('",
                                   c.operation, "') or has no options")));
  }

  comm::CommOptions o;
  o.rendezvous = absl::StrCat("tcp://127.0.0.1:", port);
  o.rank = rank;
  o.world_size = world;
  o.timeout = kWorkerTimeout;
  o.name = "keel-compat";
  o.dispatch.backend = backend;
  result<comm::Communicator> made = comm::Communicator::create(o);
  if (!made) return fail(made.error());
  comm::Communicator& group = made.value();

  PeakMemory memory;
  const auto start = Clock::now();
  result<Run> ran = family->run_rank(group, c, backend);
  const double ms = elapsed_ms(start);
  if (!ran) return fail(ran.error());

  TensorFile file;
  file.tensors = std::move(ran.value().outputs);
  file.metadata["ms"] = absl::StrCat(ms);
  file.metadata["peak_bytes"] = absl::StrCat(memory.peak_bytes());
  file.metadata["adapter"] = ran.value().adapter;
  if (auto written = write_safetensors(out, file); !written) return fail(written.error());
  // Every rank leaves together, so that none sees another's exit as a lost
  // peer while it still finishes.
  if (auto done = group.barrier(); !done) return fail(done.error());
  return kWorkerOk;
}

}  // namespace keel::harness
