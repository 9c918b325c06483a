// keel-info: what this keel build is: its version, the libtorch it was built
// against, the adapters compiled in and what each serves.
//
//   keel-info            # text
//   keel-info --json     # one JSON object, for scripts
#include <cstdio>
#include <iostream>
#include <string>

#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/usage.h>
#include <absl/strings/str_join.h>
#include <nlohmann/json.hpp>

#include "keel/c/keel.h"
#include "keel/keel.h"

ABSL_FLAG(bool, json, false, "print one JSON object instead of text");

namespace {

#define KEEL_INFO_STR2(x) #x
#define KEEL_INFO_STR(x) KEEL_INFO_STR2(x)
// The C ABI this build's plugin (KEEL_PLUGIN_NAME, beside keel-info) speaks.
constexpr const char* kCApiVersion =
    KEEL_INFO_STR(KEEL_C_API_MAJOR) "." KEEL_INFO_STR(KEEL_C_API_MINOR);

nlohmann::json to_json(const keel::BuildInfo& info) {
  nlohmann::json adapters = nlohmann::json::array();
  for (const keel::AdapterInfo& a : info.adapters) {
    nlohmann::json caps = nlohmann::json::array();
    for (const keel::CapabilityInfo& c : a.capabilities) {
      caps.push_back({{"operation", c.operation},
                      {"dtypes", c.dtypes},
                      {"devices", c.devices},
                      {"features", c.features},
                      {"implementation", c.implementation}});
    }
    adapters.push_back({{"name", a.name}, {"description", a.description}, {"capabilities", caps}});
  }
  return {{"keel_version", info.keel_version},
          {"torch_version", info.torch_version},
          {"torch_support", info.torch_support},
          {"supported_torch", info.supported_torch},
          {"cxx_standard", info.cxx_standard},
          {"cuda", info.cuda},
          {"compiler", info.compiler},
          {"build_type", info.build_type},
          {"c_api", {{"version", kCApiVersion}, {"plugin", KEEL_PLUGIN_NAME}}},
          {"adapters", adapters}};
}

void print_text(const keel::BuildInfo& info) {
  std::cout << "keel " << info.keel_version << "\n"
            << "  torch:    " << info.torch_version << " (" << info.torch_support << ")\n"
            << "  c++:      C++" << info.cxx_standard << "\n"
            << "  supports: torch " << absl::StrJoin(info.supported_torch, ", ") << "\n"
            << "  cuda:     " << (info.cuda ? "yes" : "no") << "\n"
            << "  compiler: " << info.compiler << " (" << info.build_type << ")\n"
            << "  c abi:    " << kCApiVersion << " (plugin " << KEEL_PLUGIN_NAME << ")\n"
            << "  adapters: ";
  std::string names;
  for (const keel::AdapterInfo& a : info.adapters) names += (names.empty() ? "" : ", ") + a.name;
  std::cout << names << "\n";
  for (const keel::AdapterInfo& a : info.adapters) {
    std::cout << "\nadapter " << a.name << ": " << a.description << "\n";
    for (const keel::CapabilityInfo& c : a.capabilities) {
      std::cout << "  " << c.operation << "\n"
                << "    implementation: " << c.implementation << "\n"
                << "    dtypes:         " << absl::StrJoin(c.dtypes, ", ") << "\n"
                << "    devices:        " << absl::StrJoin(c.devices, ", ") << "\n"
                << "    features:       " << absl::StrJoin(c.features, ", ") << "\n";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Prints what this keel build is: versions, adapters, capabilities.");
  const auto positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::cerr << "keel-info: unexpected argument '" << positional[1] << "'; try --help\n";
    return 2;
  }
  try {
    const keel::BuildInfo& info = keel::build_info();
    if (absl::GetFlag(FLAGS_json)) {
      std::cout << to_json(info).dump(2) << "\n";
    } else {
      print_text(info);
    }
  } catch (const std::exception& e) {
    std::cerr << "keel-info: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
