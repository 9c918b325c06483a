// Uses the installed keel through its public headers only.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <keel/keel.h>

// The standard keel::keel gave this consumer, which asked for C++17.
#if KEEL_EXPECT_CXX == 17
static_assert(__cplusplus == 201703L, "keel built as C++17 gives its consumers C++17");
#elif KEEL_EXPECT_CXX == 20
static_assert(__cplusplus == 202002L, "keel built as C++20 gives its consumers C++20");
#else
#error "KEEL_EXPECT_CXX must be 17 or 20"
#endif

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer EXPECTED_TORCH_VERSION\n";
    return 2;
  }
  const keel::BuildInfo& info = keel::build_info();
  if (info.torch_version != argv[1] || std::strcmp(keel::version(), KEEL_VERSION_STRING) != 0) {
    std::cerr << "consumer: keel " << keel::version() << " on torch " << info.torch_version
              << ", expected keel " << KEEL_VERSION_STRING << " on torch " << argv[1] << "\n";
    return 1;
  }
  // log(exp(0) + exp(0)) = log 2.
  keel::result<keel::LogsumexpOutput> r = keel::logsumexp(at::zeros({3, 2}));
  if (!r) {
    std::cerr << "consumer: " << r.error().to_string() << "\n";
    return 1;
  }
  const double got = r.value().value[1].item<double>();
  if (std::abs(got - std::log(2.0)) > 1e-6) {
    std::cerr << "consumer: logsumexp gave " << got << "\n";
    return 1;
  }
  keel::result<keel::LogsumexpOutput> bad = keel::logsumexp(at::zeros({3}, at::kLong));
  if (bad || bad.error().code() != keel::Errc::invalid_argument) {
    std::cerr << "consumer: an int64 input was not rejected\n";
    return 1;
  }
  // A service's own case, recorded and replayed through libkeel's
  // keel::compat (one build plays both sides here).
  const std::string golden = "consumer-golden.safetensors";
  keel::compat::Case c;
  c.id = "square";
  c.inputs["x"] = at::arange(6, at::kDouble);
  auto square = [](const keel::compat::Case& k) -> keel::result<keel::compat::Tensors> {
    return keel::compat::Tensors{{"y", k.inputs.at("x") * k.inputs.at("x")}};
  };
  keel::result<void> recorded = keel::compat::record(golden, {c}, square);
  keel::result<keel::compat::Report> report =
      recorded ? keel::compat::compare(golden, square) : recorded.error();
  std::remove(golden.c_str());
  if (!report || !report.value().ok() || report.value().passed != 1) {
    std::cerr << "consumer: keel::compat "
              << (report ? keel::compat::to_text(report.value()) : report.error().to_string())
              << "\n";
    return 1;
  }
  if (info.cxx_standard != KEEL_EXPECT_CXX) {
    std::cerr << "consumer: keel says C++" << info.cxx_standard << "\n";
    return 1;
  }
  std::cout << "consumer: built as C++" << KEEL_EXPECT_CXX << " (__cplusplus " << __cplusplus
            << "), keel " << keel::version() << " on torch " << info.torch_version << " via "
            << r.value().dispatch.adapter << "\n";
  return 0;
}
