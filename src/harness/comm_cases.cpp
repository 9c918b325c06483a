// The communicator family: a 2-rank set of all_reduce (sum, avg, max),
// all_gather, reduce_scatter (sum) and broadcast, float32 and bfloat16 (and
// int64 for the sums), small odd sizes. Each rank's input is drawn at record
// time and stored; a run spawns two keel-compat processes (the hidden
// `comm-worker` command) on loopback, each loads its stored input, runs the
// collective through keel::comm and writes its output back. The case's
// outputs are both ranks' results, "rank0" and "rank1".
//
// A worker that hangs is killed at a deadline and the case errors, naming
// the rank; a build whose adapter cannot form the group (Errc::unsupported)
// gets the case skipped with the worker's reason.
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "harness/peak_memory.h"
#include "harness/safetensors.h"
#include "harness/suite.h"
#include "keel/v1/comm.h"

extern char** environ;

namespace keel::harness {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr int kRanks = 2;
// A worker's own bound on rendezvous and on the collective: it fails by
// itself, with keel's message, well before the parent's deadline kills it.
constexpr Millis kWorkerTimeout{20000};
// What a worker's exit status means to the parent.
constexpr int kWorkerOk = 0;
constexpr int kWorkerFailed = 1;
constexpr int kWorkerUsage = 2;
constexpr int kWorkerUnsupported = 3;

CommLaunch& launch_settings() {
  static CommLaunch settings;
  return settings;
}

std::string rank_name(int r) {
  return absl::StrCat("rank", r);
}

result<comm::ReduceOp> parse_reduce(const std::string& name) {
  if (name == "sum") return comm::ReduceOp::sum;
  if (name == "avg") return comm::ReduceOp::avg;
  if (name == "max") return comm::ReduceOp::max;
  if (name == "min") return comm::ReduceOp::min;
  if (name == "product") return comm::ReduceOp::product;
  return Error(Errc::invalid_argument, absl::StrCat("comm: reduce op '", name,
                                                    "'; expected sum, avg, min, max or product"));
}

// One collective on `input` through `comm`; the rank's result.
result<at::Tensor> run_collective(comm::Communicator& comm, const nlohmann::json& options,
                                  const at::Tensor& input) {
  const std::string op = options.value("op", "");
  if (op == "all_reduce" || op == "reduce_scatter") {
    auto reduce = parse_reduce(options.value("reduce", "sum"));
    if (!reduce) return reduce.error();
    if (op == "all_reduce") {
      at::Tensor t = input.clone();
      auto r = comm.all_reduce(t, reduce.value());
      if (!r) return r.error();
      return t;
    }
    if (input.dim() == 0 || input.size(0) % comm.size() != 0) {
      return Error(Errc::corrupt_data,
                   absl::StrCat("comm: reduce_scatter's stored input has ", input.dim(),
                                " dims and leading size ", input.dim() ? input.size(0) : 0,
                                "; expected a leading size divisible by ", comm.size()));
    }
    std::vector<std::int64_t> shape = input.sizes().vec();
    shape[0] /= comm.size();
    at::Tensor out = at::empty(shape, input.options());
    auto r = comm.reduce_scatter(out, input, reduce.value());
    if (!r) return r.error();
    return out;
  }
  if (op == "all_gather") {
    if (input.dim() == 0) {
      return Error(Errc::corrupt_data, "comm: all_gather's stored input is a scalar");
    }
    std::vector<std::int64_t> shape = input.sizes().vec();
    shape[0] *= comm.size();
    at::Tensor out = at::empty(shape, input.options());
    auto r = comm.all_gather(out, input);
    if (!r) return r.error();
    return out;
  }
  if (op == "broadcast") {
    at::Tensor t = input.clone();
    auto r = comm.broadcast(t, options.value("root", 0));
    if (!r) return r.error();
    return t;
  }
  return Error(Errc::corrupt_data,
               absl::StrCat("comm: operation '", op,
                            "'; expected all_reduce, all_gather, reduce_scatter or broadcast"));
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

// The last lines of a worker's log, for an error message.
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
        (std::filesystem::temp_directory_path() / "keel-compat-comm-XXXXXX").string();
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

// Kills and reaps every worker still running.
void kill_all(std::array<Worker, kRanks>& workers) {
  for (Worker& w : workers) {
    if (w.pid > 0 && !w.done) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
      w.done = true;
      w.status = 128 + SIGKILL;
    }
  }
}

class CommFamily final : public Family {
 public:
  std::string operation() const override { return "comm"; }

  std::vector<Case> make_cases() const override {
    std::vector<Case> cases;
    at::manual_seed(20261206);
    struct Spec {
      const char* name;
      nlohmann::json options;
      std::vector<std::int64_t> shape;  // each rank's input
      bool with_int64;
    };
    const Spec specs[] = {
        {"all_reduce_sum", {{"op", "all_reduce"}, {"reduce", "sum"}}, {13}, true},
        {"all_reduce_avg", {{"op", "all_reduce"}, {"reduce", "avg"}}, {3, 5}, false},
        {"all_reduce_max", {{"op", "all_reduce"}, {"reduce", "max"}}, {7}, false},
        {"all_gather", {{"op", "all_gather"}}, {5, 3}, false},
        {"reduce_scatter_sum", {{"op", "reduce_scatter"}, {"reduce", "sum"}}, {14, 3}, true},
        {"broadcast_root1", {{"op", "broadcast"}, {"root", 1}}, {11}, false},
    };
    const std::pair<at::ScalarType, const char*> dtypes[] = {
        {at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"}, {at::kLong, "int64"}};
    for (const auto& [type, dtype] : dtypes) {
      for (const Spec& s : specs) {
        if (type == at::kLong && !s.with_int64) continue;
        Case c;
        c.id = absl::StrCat("comm/", dtype, "/", s.name);
        c.operation = operation();
        c.dtype = dtype;
        c.options = s.options;
        c.options["ranks"] = kRanks;
        for (int r = 0; r < kRanks; ++r) {
          c.inputs[rank_name(r)] = type == at::kLong
                                       ? at::randint(-1000, 1000, s.shape, at::kLong)
                                       : (at::randn(s.shape, at::kDouble) * 4).to(type);
        }
        // With two ranks every output is a copy or one correctly rounded
        // operation per element (a + b, then avg's exact halving), the same
        // in any order and on any release: a difference is a bug, not
        // summation order, so the case is judged exactly.
        c.tolerance = Tolerance{0, 0};
        cases.push_back(std::move(c));
      }
    }
    return cases;
  }

  result<Run> run(const Case& c, Backend backend) const override {
    const int ranks = c.options.value("ranks", kRanks);
    if (ranks != kRanks) {
      return Error(Errc::corrupt_data, absl::StrCat("comm: case ", c.id, " has ", ranks,
                                                    " ranks; keel-compat runs ", kRanks));
    }
    for (int r = 0; r < kRanks; ++r) {
      if (c.inputs.count(rank_name(r)) == 0) {
        return Error(Errc::corrupt_data, absl::StrCat("comm: case ", c.id, " has no stored input '",
                                                      rank_name(r), "'"));
      }
    }
    // Collectives need the same shape and dtype on every rank; checked here,
    // since a mismatch inside Gloo is a wait until the timeout.
    const at::Tensor& first = c.inputs.at(rank_name(0));
    for (int r = 1; r < kRanks; ++r) {
      const at::Tensor& t = c.inputs.at(rank_name(r));
      if (t.sizes() != first.sizes() || t.scalar_type() != first.scalar_type()) {
        return Error(
            Errc::corrupt_data,
            absl::StrCat("comm: case ", c.id, ": stored input '", rank_name(r), "' is ",
                         c10::toString(t.scalar_type()), " of shape [",
                         absl::StrJoin(t.sizes(), ","), "], rank0's is ",
                         c10::toString(first.scalar_type()), " of shape [",
                         absl::StrJoin(first.sizes(), ","), "]; every rank needs the same"));
      }
    }
    const CommLaunch settings = launch_settings();
    ScratchDir dir;
    if (dir.path().empty()) {
      return Error(Errc::io_error, "comm: cannot make a scratch directory for the workers");
    }
    const int port = free_port();
    if (port == 0) return Error(Errc::io_error, "comm: no free loopback port for the workers");
    const std::string exe = settings.executable.empty() ? self_executable() : settings.executable;

    std::array<Worker, kRanks> workers;
    for (int r = 0; r < kRanks; ++r) {
      Worker& w = workers[r];
      const std::string base = (std::filesystem::path(dir.path()) / rank_name(r)).string();
      w.log = base + ".log";
      w.inputs = base + ".in.safetensors";
      w.out = base + ".out.safetensors";
      TensorFile in;
      in.tensors["input"] = c.inputs.at(rank_name(r));
      in.metadata["case"] = c.id;
      in.metadata["options"] = c.options.dump();
      if (auto written = write_safetensors(w.inputs, in); !written) return written.error();
    }
    for (int r = 0; r < kRanks; ++r) {
      Worker& w = workers[r];
      std::vector<std::string> args{exe,        "comm-worker",     "--case", c.id,
                                    "--rank",   std::to_string(r), "--port", std::to_string(port),
                                    "--inputs", w.inputs,          "--out",  w.out};
      if (backend != Backend::unset) {
        args.emplace_back("--backend");
        args.emplace_back(to_string(backend));
      }
      std::vector<char*> argv;
      argv.reserve(args.size() + 1);
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, 1, w.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
      const int spawned = posix_spawn(&w.pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      if (spawned != 0) {
        w.pid = -1;
        kill_all(workers);
        return Error(Errc::io_error,
                     absl::StrCat("comm: case ", c.id, ": cannot start worker '", exe,
                                  "' for rank ", r, ": ", std::strerror(spawned)));
      }
    }

    // Wait for both, bounded. A rank that fails leaves its peer waiting for
    // it, so the first failure ends the case at once.
    const auto deadline = Clock::now() + settings.timeout;
    while (true) {
      bool all = true;
      int failed = -1;
      for (int r = 0; r < kRanks; ++r) {
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
            absl::StrCat("comm: case ", c.id, ": rank ", failed, " ",
                         w.status >= 128 ? absl::StrCat("died of signal ", w.status - 128)
                                         : absl::StrCat("exited with status ", w.status),
                         ": ", log_tail(w.log));
        return Error(w.status == kWorkerUnsupported ? Errc::unsupported : Errc::backend_error, why);
      }
      if (all) break;
      if (Clock::now() >= deadline) {
        std::vector<int> late;
        for (int r = 0; r < kRanks; ++r) {
          if (!workers[r].done) late.push_back(r);
        }
        kill_all(workers);
        return Error(Errc::timeout,
                     absl::StrCat("comm: case ", c.id, ": rank ", absl::StrJoin(late, " and "),
                                  " did not finish within ", settings.timeout.count(),
                                  " ms and was killed; rank ", late.front(),
                                  "'s log: ", log_tail(workers[late.front()].log)));
      }
      std::this_thread::sleep_for(Millis(5));
    }

    Run run;
    for (int r = 0; r < kRanks; ++r) {
      result<TensorFile> out = read_safetensors(workers[r].out);
      if (!out) {
        return Error(out.error().code(), absl::StrCat("comm: case ", c.id, ": rank ", r,
                                                      "'s output: ", out.error().message()));
      }
      const auto t = out.value().tensors.find("output");
      if (t == out.value().tensors.end()) {
        return Error(Errc::corrupt_data,
                     absl::StrCat("comm: case ", c.id, ": rank ", r, " wrote no output"));
      }
      run.outputs[rank_name(r)] = t->second;
      const auto& meta = out.value().metadata;
      double ms = 0;
      std::int64_t bytes = 0;
      if (auto m = meta.find("forward_ms"); m != meta.end()) (void)absl::SimpleAtod(m->second, &ms);
      if (auto m = meta.find("peak_bytes"); m != meta.end())
        (void)absl::SimpleAtoi(m->second, &bytes);
      // The collective ends when its slowest rank does.
      run.forward_ms = std::max(run.forward_ms, ms);
      run.peak_bytes = std::max(run.peak_bytes, bytes);
      if (r == 0 && meta.count("adapter") != 0u) run.adapter = meta.at("adapter");
    }
    return run;
  }
};

}  // namespace

std::unique_ptr<Family> make_comm_family() {
  return std::make_unique<CommFamily>();
}

void set_comm_launch(const CommLaunch& launch) {
  launch_settings() = launch;
}

CommLaunch comm_launch() {
  return launch_settings();
}

int comm_worker_main(const std::vector<std::string>& args) {
  std::string id, inputs, out, backend_text;
  int rank = -1, port = 0;
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
      ok = absl::SimpleAtoi(value, &rank) && rank >= 0 && rank < kRanks;
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
  if (id.empty() || rank < 0 || port == 0 || inputs.empty() || out.empty()) {
    std::cerr << "keel-compat comm-worker: expected --case ID --rank R --port P --inputs FILE "
                 "--out FILE [--backend auto|compat|native]\n";
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
  const auto input = in.value().tensors.find("input");
  const auto options_text = in.value().metadata.find("options");
  const nlohmann::json options = options_text == in.value().metadata.end()
                                     ? nlohmann::json()
                                     : nlohmann::json::parse(options_text->second, nullptr, false);
  if (input == in.value().tensors.end() || !options.is_object()) {
    return fail(Error(Errc::corrupt_data,
                      absl::StrCat("comm-worker: '", inputs, "' has no 'input' or no options")));
  }

  comm::CommOptions o;
  o.rendezvous = absl::StrCat("tcp://127.0.0.1:", port);
  o.rank = rank;
  o.world_size = kRanks;
  o.timeout = kWorkerTimeout;
  o.name = "keel-compat";
  o.dispatch.backend = backend;
  result<comm::Communicator> made = comm::Communicator::create(o);
  if (!made) return fail(made.error());
  comm::Communicator& group = made.value();

  PeakMemory memory;
  const auto start = Clock::now();
  result<at::Tensor> output = run_collective(group, options, input->second);
  const double ms = elapsed_ms(start);
  if (!output) return fail(output.error());

  TensorFile file;
  file.tensors["output"] = output.value();
  file.metadata["forward_ms"] = absl::StrCat(ms);
  file.metadata["peak_bytes"] = absl::StrCat(memory.peak_bytes());
  file.metadata["adapter"] = group.dispatch_info().adapter;
  if (auto written = write_safetensors(out, file); !written) return fail(written.error());
  // Both ranks leave together, so that neither sees the other's exit as a
  // lost peer while it still finishes.
  if (auto done = group.barrier(); !done) return fail(done.error());
  return kWorkerOk;
}

}  // namespace keel::harness
