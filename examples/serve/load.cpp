// keel-serve-load: the load generator of docs/serving.md. It starts
// keel-serve once per batching mode and concurrency, on loopback, sends a
// fixed seeded set of streaming completions from N concurrent clients
// (closed loop, as `vllm bench serve --max-concurrency N`), and reports
// output throughput, time to first token and time per output token (p50
// and p99), the server's peak memory, and whether every page came back.
//
//   keel-serve-load --server KEEL_SERVE --model DIR [--clients 1,8,32,64]
//                   [--modes continuous,static,serial] [--requests-per-client K]
//                   [--min-requests N] [--time-limit SECONDS] [--seed S]
//                   [--threads T] [--json OUT]
//
// Bounded in count (requests per cell) and time (--time-limit over the
// whole run; a cell past it sends nothing more). Exit status 0 when every
// request of every cell completed and every server returned all its pages.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "process.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string server, model, json_out;
  std::vector<int> clients = {1, 8, 32, 64};
  std::vector<std::string> modes = {"continuous", "static", "serial"};
  int per_client = 2, min_requests = 8, time_limit = 600, threads = 1;
  std::uint64_t seed = 20261206;
};

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31U);
}

struct Job {
  std::string prompt;
  int max_tokens = 0;
};

// The fixed workload: prompts of 16-128 characters of lower-case words;
// output lengths exponential with mean 32, within [4, 128] (their spread is
// what separates continuous from static batching), each generated whole
// (ignore_eos, as vllm bench serve does).
std::vector<Job> workload(std::uint64_t seed, int n) {
  static const char kLetters[] = "etaoinshrdlucmfwypvbgk";
  std::vector<Job> jobs;
  for (int i = 0; i < n; ++i) {
    Job j;
    const auto len = 16 + static_cast<int>(splitmix(seed) % 113);
    while (static_cast<int>(j.prompt.size()) < len) {
      const auto word = 1 + static_cast<int>(splitmix(seed) % 8);
      for (int k = 0; k < word; ++k) j.prompt += kLetters[splitmix(seed) % (sizeof kLetters - 1)];
      j.prompt += ' ';
    }
    j.prompt.resize(static_cast<std::size_t>(len));
    const double u = static_cast<double>(splitmix(seed) >> 11U) * 0x1.0p-53;
    j.max_tokens = std::clamp(static_cast<int>(-32.0 * std::log(1.0 - u)), 4, 128);
    jobs.push_back(j);
  }
  return jobs;
}

struct Sample {
  bool ok = false;
  double ttft_ms = 0, tpot_ms = 0;
  std::int64_t tokens = 0;
  std::string error;
};

// One streaming completion; TTFT and TPOT as vllm bench serve measures them.
Sample run_one(httplib::Client& client, const Job& job) {
  Sample s;
  const json body = {{"model", "load"},
                     {"prompt", job.prompt},
                     {"max_tokens", job.max_tokens},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string buffer;
  bool first = false, done = false;
  const auto start = Clock::now();
  auto last = start;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  req.content_receiver = [&](const char* data, std::size_t len, std::uint64_t, std::uint64_t) {
    buffer.append(data, len);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string frame = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (frame.rfind("data: ", 0) != 0) continue;
      const std::string payload = frame.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded() || j.contains("error")) {
        s.error = j.is_discarded() ? "bad JSON in the stream" : j["error"].value("message", "");
        return false;
      }
      if (!j["choices"].empty()) {
        const auto now = Clock::now();
        if (!first) s.ttft_ms = ms(now - start);
        first = true;
        last = now;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        s.tokens = j["usage"]["completion_tokens"].get<std::int64_t>();
      }
    }
    return true;
  };
  const httplib::Result r = client.send(req);
  if (!r || r->status != 200 || !done) {
    if (s.error.empty()) {
      s.error = !r ? "HTTP error " + httplib::to_string(r.error())
                   : "status " + std::to_string(r->status) + (done ? "" : ", no [DONE]");
    }
    return s;
  }
  s.ok = true;
  if (s.tokens > 1) s.tpot_ms = (ms(last - start) - s.ttft_ms) / static_cast<double>(s.tokens - 1);
  return s;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

// A server of its own for one cell: started, waited for (bounded), stopped.
class Server {
 public:
  Server(const Options& o, const std::string& mode, int clients) {
    char dir[] = "/tmp/keel-serve-load-XXXXXX";
    if (::mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = dir;
    port_file_ = dir_ + "/port";
    std::vector<std::string> args = {o.server,
                                     "--model",
                                     o.model,
                                     "--model-name",
                                     "load",
                                     "--batching",
                                     mode,
                                     "--port-file",
                                     port_file_,
                                     "--max-waiting",
                                     std::to_string(clients),
                                     "--threads",
                                     std::to_string(o.threads)};
    keel::tooling::SpawnOptions quiet;
    quiet.stdout_path = "/dev/null";
    const keel::tooling::Spawned server = keel::tooling::spawn(o.server, std::move(args), quiet);
    if (!server) throw std::runtime_error("cannot start " + o.server);
    pid_ = server.pid;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (port_ == 0) {
      std::ifstream f(port_file_);
      if (!(f >> port_)) port_ = 0;
      int status = 0;
      if (port_ == 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        throw std::runtime_error("keel-serve exited before it listened");
      }
      if (port_ == 0 && Clock::now() > deadline)
        throw std::runtime_error("keel-serve did not listen within 60 s");
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Server() { stop(); }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  [[nodiscard]] int port() const { return port_; }

  // The server's resident high-water mark, in MiB.
  [[nodiscard]] double peak_mib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(f, line);) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    }
    return 0;
  }

  // Waits (bounded) until nothing runs, then whether every page is free.
  [[nodiscard]] bool pages_returned() const {
    httplib::Client c("127.0.0.1", port_);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      const httplib::Result r = c.Get("/keel/stats");
      if (r && r->status == 200) {
        const json s = json::parse(r->body, nullptr, false);
        if (!s.is_discarded() && s["running"] == 0 && s["waiting"] == 0) {
          return s["pages_free"] == s["pages_total"];
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // SIGTERM, then SIGKILL after 10 s; the exit status says whether the
  // server found every page free when it stopped.
  bool stop() {
    if (pid_ == 0) return true;
    ::kill(pid_, SIGTERM);
    int status = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid_, &status, WNOHANG) != pid_) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = 0;
    std::remove(port_file_.c_str());
    ::rmdir(dir_.c_str());
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
  std::string dir_, port_file_;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

int run(const Options& o) {
  const auto run_deadline = Clock::now() + std::chrono::seconds(o.time_limit);
  json cells = json::array();
  std::string torch;  // the release the servers ran on (from /keel/stats)
  bool all_ok = true;
  std::printf("%-11s %7s %8s %8s %10s %9s %9s %9s %9s %9s %6s\n", "mode", "clients", "requests",
              "done", "tokens/s", "ttft p50", "ttft p99", "tpot p50", "tpot p99", "peak MiB",
              "pages");
  for (int clients : o.clients) {
    const int n = std::max(o.min_requests, o.per_client * clients);
    const std::vector<Job> jobs = workload(o.seed + static_cast<std::uint64_t>(clients), n);
    for (const std::string& mode : o.modes) {
      json cell = {{"mode", mode}, {"clients", clients}, {"requests", n}};
      try {
        Server server(o, mode, clients);
        {
          httplib::Client warm("127.0.0.1", server.port());
          (void)run_one(warm, {"warm up ", 4});
          if (const httplib::Result r = warm.Get("/keel/stats"); r && torch.empty()) {
            torch = json::parse(r->body, nullptr, false).value("torch", "");
          }
        }
        std::atomic<int> next{0};
        std::mutex mutex;
        std::vector<Sample> samples;
        const auto start = Clock::now();
        std::vector<std::thread> threads;
        threads.reserve(static_cast<std::size_t>(clients));
        for (int c = 0; c < clients; ++c) {
          threads.emplace_back([&] {
            httplib::Client client("127.0.0.1", server.port());
            client.set_read_timeout(120, 0);
            for (int i; (i = next.fetch_add(1)) < n && Clock::now() < run_deadline;) {
              Sample s = run_one(client, jobs[static_cast<std::size_t>(i)]);
              std::lock_guard<std::mutex> lock(mutex);
              samples.push_back(std::move(s));
            }
          });
        }
        for (std::thread& t : threads) t.join();
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        std::vector<double> ttft, tpot;
        std::int64_t tokens = 0;
        int done = 0;
        std::string first_error;
        for (const Sample& s : samples) {
          if (!s.ok) {
            if (first_error.empty()) first_error = s.error;
            continue;
          }
          ++done;
          tokens += s.tokens;
          ttft.push_back(s.ttft_ms);
          if (s.tokens > 1) tpot.push_back(s.tpot_ms);
        }
        const double peak = server.peak_mib();
        const bool pages = server.pages_returned();
        const bool clean = server.stop();
        cell["done"] = done;
        cell["seconds"] = seconds;
        cell["output_tokens_per_s"] = static_cast<double>(tokens) / seconds;
        cell["ttft_ms"] = {{"p50", percentile(ttft, 50)}, {"p99", percentile(ttft, 99)}};
        cell["tpot_ms"] = {{"p50", percentile(tpot, 50)}, {"p99", percentile(tpot, 99)}};
        cell["peak_mib"] = peak;
        cell["pages_returned"] = pages && clean;
        if (!first_error.empty()) cell["first_error"] = first_error;
        all_ok = all_ok && done == n && pages && clean;
        std::printf("%-11s %7d %8d %8d %10.0f %9.1f %9.1f %9.2f %9.2f %9.0f %6s\n", mode.c_str(),
                    clients, n, done, static_cast<double>(tokens) / seconds, percentile(ttft, 50),
                    percentile(ttft, 99), percentile(tpot, 50), percentile(tpot, 99), peak,
                    pages && clean ? "back" : "LOST");
        if (!first_error.empty()) std::printf("  first error: %s\n", first_error.c_str());
      } catch (const std::exception& e) {
        cell["first_error"] = e.what();
        all_ok = false;
        std::printf("%-11s %7d  failed: %s\n", mode.c_str(), clients, e.what());
      }
      std::fflush(stdout);
      cells.push_back(cell);
    }
  }
  // Ratios within one run: continuous against the two alternatives.
  for (int clients : o.clients) {
    std::map<std::string, double> tps;
    for (const json& c : cells) {
      if (c["clients"] == clients && c.contains("output_tokens_per_s")) {
        tps[c["mode"].get<std::string>()] = c["output_tokens_per_s"].get<double>();
      }
    }
    if (tps.count("continuous") && tps.count("static") && tps.count("serial")) {
      std::printf("clients %2d: continuous/static throughput %.2f, continuous/serial %.2f\n",
                  clients, tps["continuous"] / tps["static"], tps["continuous"] / tps["serial"]);
    }
  }
  if (!o.json_out.empty()) {
    std::ofstream(o.json_out) << json{{"seed", o.seed}, {"torch", torch}, {"cells", cells}}.dump(1)
                              << "\n";
  }
  return all_ok ? 0 : 1;
}

int usage(const std::string& why) {
  std::cerr << "keel-serve-load: " << why
            << "\nusage: keel-serve-load --server KEEL_SERVE --model DIR [--clients 1,8,32,64] "
               "[--modes continuous,static,serial] [--requests-per-client K] [--min-requests N] "
               "[--time-limit SECONDS] [--seed S] [--threads T] [--json OUT]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage("missing value after " + a);
    const std::string v = argv[++i];
    try {
      if (a == "--server") {
        o.server = v;
      } else if (a == "--model") {
        o.model = v;
      } else if (a == "--json") {
        o.json_out = v;
      } else if (a == "--modes") {
        o.modes = split(v);
      } else if (a == "--clients") {
        o.clients.clear();
        for (const std::string& c : split(v)) o.clients.push_back(std::stoi(c));
      } else if (a == "--requests-per-client") {
        o.per_client = std::stoi(v);
      } else if (a == "--min-requests") {
        o.min_requests = std::stoi(v);
      } else if (a == "--time-limit") {
        o.time_limit = std::stoi(v);
      } else if (a == "--threads") {
        o.threads = std::stoi(v);
      } else if (a == "--seed") {
        o.seed = std::stoull(v);
      } else {
        return usage("unknown option " + a);
      }
    } catch (const std::exception&) {
      return usage("bad value for " + a);
    }
  }
  if (o.server.empty() || o.model.empty()) return usage("--server and --model are required");
  for (int c : o.clients) {
    if (c < 1 || c > 256) return usage("--clients: each in [1, 256]");
  }
  for (const std::string& m : o.modes) {
    if (m != "continuous" && m != "static" && m != "serial")
      return usage("--modes: continuous, static, serial");
  }
  if (o.per_client < 1 || o.min_requests < 1 || o.time_limit < 1)
    return usage("counts must be >= 1");

  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "keel-serve-load: " << e.what() << "\n";
    return 2;
  }
}
