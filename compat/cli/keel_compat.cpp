// keel-compat: record keel's canonical suite on one build, compare it on
// another. The upgrade report of docs/upgrade-guide.md.
//
//   keel-compat cases   [--filter A,B]
//   keel-compat record  --out FILE [--filter A,B] [--backend auto|compat|native]
//   keel-compat compare --golden FILE [--backend ...] [--repeat N] [--json FILE] [--html FILE]
//   keel-compat diff A B [--atol X --rtol Y] [--policy FILE] [--json FILE] [--html FILE]
//
// diff compares any two safetensors files (Python's safetensors writes
// them too), tensor by tensor, B against A (compat/engine/diff.h).
//
// The comm cases start two copies of this program as their ranks, through
// the hidden command `keel-compat comm-worker ...` (compat/suite/rank_workers.h).
//
// Exit status: 0 when every compared case (or tensor) passed, 1 when any
// failed or errored (for diff: differs, or is in one file only), 2 for a
// usage error or a file that cannot be read or written.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/usage.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>

#include "engine/diff.h"
#include "keel/keel.h"
#include "suite/rank_workers.h"
#include "suite/record_compare.h"

ABSL_FLAG(std::string, out, "", "record: the safetensors file to write");
ABSL_FLAG(std::string, golden, "", "compare: the safetensors file recorded earlier");
ABSL_FLAG(std::string, backend, "", "auto, compat or native (default: KEEL_BACKEND, else auto)");
ABSL_FLAG(int, repeat, 2, "compare: runs per case, for the bitwise determinism check");
ABSL_FLAG(std::string, filter, "",
          "only cases whose id contains one of these comma-separated parts");
ABSL_FLAG(std::string, json, "", "compare, diff: also write the report as JSON to this file");
ABSL_FLAG(std::string, html, "", "compare, diff: also write the report as HTML to this file");
ABSL_FLAG(std::string, atol, "", "diff: the absolute tolerance of every tensor (with --rtol)");
ABSL_FLAG(std::string, rtol, "", "diff: the relative tolerance of every tensor (with --atol)");
ABSL_FLAG(std::string, policy, "",
          "diff: a JSON file of tensor name (or prefix*) -> {\"atol\": x, \"rtol\": y}");

namespace {

using keel::harness::Progress;

int fail(const keel::Error& e) {
  std::cerr << "keel-compat: " << e.to_string() << "\n";
  return 2;
}

Progress progress_bar() {
  if (isatty(STDERR_FILENO) == 0) return {};
  return [](std::size_t done, std::size_t total, const std::string& id) {
    const int width = 30;
    const int filled = total == 0 ? width : static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %-40.40s", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done, total, id.c_str());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

keel::result<void> write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  if (out) out << text;
  if (out) out.close();
  if (!out) return keel::Error(keel::Errc::io_error, "keel-compat: cannot write '" + path + "'");
  return keel::success();
}

// --atol or --rtol as a number (unset when empty).
keel::result<std::optional<double>> number_flag(const std::string& name, const std::string& text) {
  if (text.empty()) return std::optional<double>();
  double v = 0;
  if (!absl::SimpleAtod(text, &v)) {
    return keel::Error(keel::Errc::invalid_argument,
                       "diff: --" + name + " '" + text + "' is not a number");
  }
  return std::optional<double>(v);
}

// Writes the report's JSON and HTML where the flags ask.
template <class R>
keel::result<void> write_reports(const R& report) {
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    auto written = write_text(path, keel::harness::to_json(report).dump(2) + "\n");
    if (!written) return written;
  }
  if (const std::string path = absl::GetFlag(FLAGS_html); !path.empty()) {
    return write_text(path, keel::harness::to_html(report));
  }
  return keel::success();
}

int diff_main(const std::string& a, const std::string& b) {
  keel::harness::DiffOptions options;
  options.a = a;
  options.b = b;
  auto atol = number_flag("atol", absl::GetFlag(FLAGS_atol));
  if (!atol) return fail(atol.error());
  auto rtol = number_flag("rtol", absl::GetFlag(FLAGS_rtol));
  if (!rtol) return fail(rtol.error());
  options.atol = atol.value();
  options.rtol = rtol.value();
  options.policy_file = absl::GetFlag(FLAGS_policy);
  const auto report = keel::harness::diff(options);
  if (!report) return fail(report.error());
  std::cout << keel::harness::summary_text(report.value());
  if (auto written = write_reports(report.value()); !written) return fail(written.error());
  return report.value().ok() ? 0 : 1;
}

keel::result<keel::Backend> backend_flag() {
  const std::string text = absl::GetFlag(FLAGS_backend);
  if (text.empty()) return keel::Backend::unset;
  return keel::parse_backend(text);
}

}  // namespace

int main(int argc, char** argv) {
  // A rank of a comm case: its own small grammar, kept out of --help.
  if (argc >= 2 && std::string(argv[1]) == "comm-worker") {
    try {
      return keel::harness::comm_worker_main(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::cerr << "keel-compat comm-worker: internal error: " << e.what() << "\n";
      return 1;
    }
  }
  absl::SetProgramUsageMessage(
      "keel-compat cases|record|compare|diff A B: record keel's suite on one build, compare on "
      "another; diff any two safetensors files");
  const auto args = absl::ParseCommandLine(argc, argv);
  if (args.size() >= 2 && std::string(args[1]) == "diff") {
    if (args.size() != 4) {
      std::cerr << "keel-compat: diff takes two files: keel-compat diff A B (try --help)\n";
      return 2;
    }
    try {
      return diff_main(args[2], args[3]);
    } catch (const std::exception& e) {
      std::cerr << "keel-compat: internal error: " << e.what() << "\n";
      return 2;
    }
  }
  if (args.size() != 2) {
    std::cerr << "keel-compat: expected one command: cases, record, compare or diff (try "
                 "--help)\n";
    return 2;
  }
  const std::string command = args[1];
  const keel::result<keel::Backend> backend = backend_flag();
  if (!backend) return fail(backend.error());
  try {
    if (command == "cases") {
      int n = 0;
      for (const auto& family : keel::harness::families()) {
        for (const auto& c : family->make_cases()) {
          if (!keel::harness::matches_filter(c.id, absl::GetFlag(FLAGS_filter))) continue;
          std::cout << c.id << "\n";
          ++n;
        }
      }
      std::cerr << n << " cases\n";
      return 0;
    }
    if (command == "record") {
      keel::harness::RecordOptions options;
      options.out = absl::GetFlag(FLAGS_out);
      if (options.out.empty()) {
        return fail(keel::Error(keel::Errc::invalid_argument, "record: --out FILE is required"));
      }
      options.filter = absl::GetFlag(FLAGS_filter);
      options.backend = backend.value();
      options.progress = progress_bar();
      const auto n = keel::harness::record(options);
      if (!n) return fail(n.error());
      std::cout << absl::StrFormat("keel-compat: recorded %d cases on torch %s into %s\n",
                                   n.value(), keel::build_info().torch_version, options.out);
      return 0;
    }
    if (command == "compare") {
      keel::harness::CompareOptions options;
      options.golden = absl::GetFlag(FLAGS_golden);
      if (options.golden.empty()) {
        return fail(
            keel::Error(keel::Errc::invalid_argument, "compare: --golden FILE is required"));
      }
      options.filter = absl::GetFlag(FLAGS_filter);
      options.backend = backend.value();
      options.repeat = absl::GetFlag(FLAGS_repeat);
      options.progress = progress_bar();
      const auto report = keel::harness::compare(options);
      if (!report) return fail(report.error());
      std::cout << keel::harness::summary_text(report.value());
      if (auto written = write_reports(report.value()); !written) return fail(written.error());
      if (const std::string path = absl::GetFlag(FLAGS_html); !path.empty()) {
        std::cout << "keel-compat: HTML report: " << path << "\n";
      }
      return report.value().failed + report.value().errors == 0 ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "keel-compat: internal error: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "keel-compat: unknown command '" << command
            << "'; expected cases, record or compare\n";
  return 2;
}
