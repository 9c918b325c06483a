// Every example in keel's public headers, as code that compiles and runs:
// the headers show these regions with Doxygen's @snippet, so an example can
// never drift from the API or be garbled by formatting. CI builds this
// program and runs it (ctest examples.header_snippets_run): each example
// must succeed. The communicator examples run as a one-rank job, with the
// environment torchrun would set.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "keel/keel.h"

namespace {

int keel_h() {
  //! [keel_h]
  std::cout << "keel " << keel::version() << " on torch " << keel::build_info().torch_version
            << "\n";
  auto r = keel::logsumexp(at::randn({2, 8}));
  return r ? 0 : 1;
  //! [keel_h]
}

int attention_window() {
  //! [attention_window]
  at::Tensor q = at::randn({1, 8, 1024, 64});  // [B, Hq, Lq, E]
  at::Tensor k = at::randn({1, 2, 1024, 64});  // [B, Hkv, Lk, E]: 4 query heads per kv head
  at::Tensor v = at::randn({1, 2, 1024, 64});  // [B, Hkv, Lk, Ev]
  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::sliding_window(256, 0)};  // a causal window of 257 keys
  spec.return_lse = true;
  keel::result<keel::AttentionOutput> r = keel::attention(q, k, v, spec);
  if (!r) {
    std::cerr << r.error().to_string() << "\n";
    return 1;
  }
  at::Tensor out = r.value().out;  // [1, 8, 1024, 64], q's dtype
  at::Tensor lse = r.value().lse;  // [1, 8, 1024], float32
  std::cout << keel::to_string(r.value().dispatch.attention.route) << ": "
            << r.value().dispatch.reason << "\n";  // which path ran, and why
  //! [attention_window]
  return out.sizes() == at::IntArrayRef({1, 8, 1024, 64}) && lse.size(2) == 1024 ? 0 : 1;
}

int attention_paged() {
  //! [attention_paged]
  // 2 sequences of 40 and 3 keys over a pool of 8 pages of 16 keys.
  at::Tensor q = at::randn({2, 32, 1, 128});  // one decode step, 32 query heads
  keel::PagedKVCache cache;
  cache.k_pages = at::randn({8, 8, 16, 128});  // 8 kv heads
  cache.v_pages = at::randn({8, 8, 16, 128});
  cache.page_table = at::tensor({5, 2, 7, 0, 0, 0}, at::kInt).view({2, 3});
  cache.lengths = at::tensor({40, 3}, at::kInt);
  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right)};
  keel::result<keel::AttentionOutput> r = keel::attention(q, cache, spec);
  if (!r) {
    std::cerr << r.error().to_string() << "\n";
    return 1;
  }
  at::Tensor out = r.value().out;  // [2, 32, 1, 128]
  //! [attention_paged]
  return out.sizes() == at::IntArrayRef({2, 32, 1, 128}) ? 0 : 1;
}

int attention_packed() {
  //! [attention_packed]
  // One serving step: sequence 0 decodes (1 query), sequence 1 prefills a
  // chunk of 4 queries; packed as 5 rows, each against its own cache.
  keel::PackedQueries q;
  q.q = at::randn({5, 32, 128});                     // [T, Hq, E]
  q.cu_seqlens_q = at::tensor({0, 1, 5}, at::kInt);  // sequence b: rows [cu[b], cu[b+1])
  keel::PagedKVCache cache;
  cache.k_pages = at::randn({8, 8, 16, 128});
  cache.v_pages = at::randn({8, 8, 16, 128});
  cache.page_table = at::tensor({5, 2, 7, 0, 0, 0}, at::kInt).view({2, 3});
  cache.lengths = at::tensor({40, 12}, at::kInt);
  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right)};
  keel::result<keel::AttentionOutput> r = keel::attention(q, cache, spec);
  if (!r) {
    std::cerr << r.error().to_string() << "\n";
    return 1;
  }
  at::Tensor out = r.value().out;  // [5, 32, 128], row for row with q.q
  //! [attention_packed]
  return out.sizes() == at::IntArrayRef({5, 32, 128}) ? 0 : 1;
}

int dispatch_per_call() {
  const at::Tensor x = at::randn({4, 16});
  //! [dispatch_per_call]
  keel::LogsumexpOptions options;
  options.dispatch.backend = keel::Backend::compat;  // this call only
  auto r = keel::logsumexp(x, options);
  if (r) std::cout << r.value().dispatch.adapter << ": " << r.value().dispatch.reason << "\n";
  //! [dispatch_per_call]
  return r && r.value().dispatch.served == keel::Backend::compat ? 0 : 1;
}

int error_handling() {
  const at::Tensor x = at::randn({4, 16});
  //! [error_handling]
  keel::result<keel::LogsumexpOutput> r = keel::logsumexp(x);
  if (!r) {
    std::cerr << r.error().to_string() << "\n";  // "invalid_argument: ..."
    return 1;
  }
  at::Tensor lse = r.value().value;
  //! [error_handling]
  return lse.numel() == 4 ? 0 : 1;
}

int logsumexp_masked() {
  //! [logsumexp_masked]
  at::Tensor x = at::randn({4, 1000});
  keel::LogsumexpOptions options;
  options.mask = x > 0;  // keep only the positive entries
  keel::result<keel::LogsumexpOutput> r = keel::logsumexp(x, options);
  if (!r) {
    std::cerr << r.error().to_string() << "\n";
    return 1;
  }
  at::Tensor lse = r.value().value;                 // [4], float32
  std::cout << r.value().dispatch.adapter << "\n";  // "compat": native has no mask
  //! [logsumexp_masked]
  return lse.numel() == 4 ? 0 : 1;
}

int loss() {
  //! [loss]
  at::Tensor hidden = at::randn({8, 64}).requires_grad_(true);     // [N, D]
  at::Tensor weight = at::randn({1000, 64}).requires_grad_(true);  // [V, D]
  at::Tensor target = at::randint(0, 1000, {8}, at::kLong);        // [N]
  keel::LinearCrossEntropyOptions options;
  options.label_smoothing = 0.1;
  keel::result<keel::LossOutput> r = keel::linear_cross_entropy(hidden, weight, target, options);
  if (!r) {
    std::cerr << r.error().to_string() << "\n";
    return 1;
  }
  r.value().loss.backward();  // fills hidden.grad() and weight.grad()
  //! [loss]
  return hidden.grad().defined() && weight.grad().defined() ? 0 : 1;
}

int build_info() {
  //! [build_info]
  const keel::BuildInfo& info = keel::build_info();
  std::cout << "keel " << info.keel_version << " on torch " << info.torch_version << "\n";
  for (const keel::AdapterInfo& a : info.adapters) std::cout << a.name << "\n";
  //! [build_info]
  return info.adapters.empty() ? 1 : 0;
}

int dtype_names() {
  //! [dtype_name]
  const at::Tensor x = at::zeros({2}, at::kBFloat16);
  std::cout << "x is " << keel::dtype_name(x) << "\n";  // "x is bfloat16"
  //! [dtype_name]
  return keel::dtype_name(x) == "bfloat16" && keel::dtype_name(at::kLong) == "int64" ? 0 : 1;
}

int compat_record_compare(const std::string& dir) {
  const std::string golden_path = dir + "/golden.safetensors";
  //! [compat]
  keel::compat::Case c;
  c.id = "decode/step0";
  c.inputs["x"] = at::randn({4, 8}, at::kDouble);
  auto model = [](const keel::compat::Case& c) -> keel::result<keel::compat::Tensors> {
    return keel::compat::Tensors{{"y", c.inputs.at("x").exp()}};
  };
  // On the old build:
  keel::result<void> rec = keel::compat::record(golden_path, {c}, model);
  // On the new build:
  keel::result<keel::compat::Report> r = keel::compat::compare(golden_path, model);
  if (r && !r.value().ok()) std::cerr << keel::compat::to_text(r.value());
  //! [compat]
  return rec && r && r.value().ok() ? 0 : 1;
}

int comm_all_reduce() {
  //! [comm_all_reduce]
  // Under torchrun: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE are set.
  keel::result<keel::comm::Communicator> made = keel::comm::Communicator::create();
  if (!made) {
    std::cerr << made.error().to_string() << "\n";
    return 1;
  }
  keel::comm::Communicator& comm = made.value();
  at::Tensor grad = at::ones({1024});
  keel::result<void> r = comm.all_reduce(grad, keel::comm::ReduceOp::avg);
  if (!r && r.error().code() == keel::Errc::peer_lost) {
    auto again = comm.reform();  // the survivors continue as a new group
  }
  //! [comm_all_reduce]
  if (!r) return 1;
  //! [comm_grow_back]
  // A supervisor restarts the dead rank with CommOptions::rejoin = true.
  keel::comm::ReformOptions grow;
  grow.wait_for_replacements = true;
  grow.timeout = std::chrono::seconds(60);
  auto full = comm.reform(grow);
  if (!full && full.error().code() == keel::Errc::timeout) full = comm.reform();
  //! [comm_grow_back]
  return full ? 0 : 1;
}

// A free TCP port on the loopback, as a launcher would pick for
// MASTER_PORT.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace

int main() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("keel-snippets-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // The one-rank job torchrun would describe.
  const int port = free_port();
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  const std::vector<std::pair<const char*, std::function<int()>>> examples = {
      {"keel_h", keel_h},
      {"attention_window", attention_window},
      {"attention_paged", attention_paged},
      {"attention_packed", attention_packed},
      {"dispatch_per_call", dispatch_per_call},
      {"error_handling", error_handling},
      {"logsumexp_masked", logsumexp_masked},
      {"loss", loss},
      {"build_info", build_info},
      {"dtype_name", dtype_names},
      {"compat", [&] { return compat_record_compare(dir.string()); }},
      {"comm", comm_all_reduce}};
  int failed = 0;
  for (const auto& [name, run] : examples) {
    const int rc = run();
    std::cout << "example " << name << ": " << (rc == 0 ? "ok" : "FAILED") << "\n";
    failed += rc == 0 ? 0 : 1;
  }
  std::filesystem::remove_all(dir);
  return port < 0 || failed != 0 ? 1 : 0;
}
