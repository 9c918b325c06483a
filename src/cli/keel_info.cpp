// keel-info: what this keel build is: its version, the libtorch it was built
// against, the adapters compiled in and what each serves; or, with --plugin,
// what a keel plugin file needs at run time, read without loading it.
//
//   keel-info            # text
//   keel-info --json     # one JSON object, for scripts
//   keel-info --plugin libkeel-plugin-2.15.0-cpu.so [--torch-library-dir DIR] [--json]
//
// --plugin exits 0 when the plugin's libraries resolve here (libtorch's may
// not, unless --torch-library-dir is given), 1 when some do not or the file
// has no readable keel note, 2 when it is not a 64-bit shared object of this
// machine.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/usage.h>
#include <absl/strings/str_join.h>
#include <nlohmann/json.hpp>

#include "elf_dependencies.h"
#include "keel/c/keel.h"
#include "keel/keel.h"

ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(std::string, plugin, "",
          "a keel plugin file: print what it needs at run time (its note, its libraries and "
          "where each resolves here), without loading it");
ABSL_FLAG(std::string, torch_library_dir, "",
          "with --plugin: the libtorch folder the loader would be given "
          "(KEEL_LoadOptions.torch_library_dir, KEEL_TORCH_LIBRARY_DIR); libtorch's libraries "
          "are looked for there first, and must all resolve");

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

constexpr const char* kLibtorchHint =
    "the loader must be given the folder holding it (KEEL_LoadOptions.torch_library_dir or "
    "KEEL_TORCH_LIBRARY_DIR), or a process that already runs that libtorch";
constexpr const char* kSystemHint = "missing: install it or ship it beside the plugin";

// What the loader would make of the note: the reasons it would refuse the
// file before loading it, none when it would go on.
std::vector<std::string> note_problems(const keel::cli::ElfDependencies& file) {
  if (!file.note) {
    return {"not a keel plugin: it has no .keel_plugin note, and keel's loader refuses it"};
  }
  unsigned major = 0;
  unsigned minor = 0;
  if (file.note->release.empty() || file.note->flavour.empty() ||
      std::sscanf(file.note->api.c_str(), "%u.%u", &major, &minor) != 2) {
    return {
        "its .keel_plugin note is damaged (it needs release=, flavour= and api=major.minor "
        "lines), and keel's loader refuses it"};
  }
  return {};
}

// What keel-info --plugin found, for either printer.
struct PluginReport {
  std::string path;
  keel::cli::ElfDependencies file;
  std::vector<keel::cli::Resolution> resolutions;
  std::vector<std::string> problems;          // why the loader would refuse it; empty when ok
  std::vector<std::string> unresolved_torch;  // libtorch's, without --torch-library-dir
  bool ok() const { return problems.empty(); }
};

PluginReport examine_plugin(const std::string& path, keel::cli::ElfDependencies file,
                            const std::string& torch_library_dir) {
  keel::cli::SearchOptions search;
  search.origin = keel::cli::origin_of(path);
  search.torch_library_dir = torch_library_dir;
  const char* ld_library_path = std::getenv("LD_LIBRARY_PATH");
  search.ld_library_path = ld_library_path != nullptr ? ld_library_path : "";
  search.cache = keel::cli::ldconfig_cache();

  PluginReport report{path, std::move(file), {}, {}, {}};
  report.resolutions = keel::cli::resolve(report.file, search);
  report.problems = note_problems(report.file);
  for (const keel::cli::Resolution& r : report.resolutions) {
    if (r.path) continue;
    if (!r.libtorch) {
      report.problems.push_back(r.name + " is missing");
    } else if (!torch_library_dir.empty()) {
      report.problems.push_back(r.name + " (libtorch's) is in neither '" + torch_library_dir +
                                "' nor the folders searched after it");
    } else {
      // Expected where the plugin's libtorch is not installed for the
      // system: the loader is told its folder at run time.
      report.unresolved_torch.push_back(r.name);
    }
  }
  return report;
}

nlohmann::json to_json(const PluginReport& report) {
  auto or_null = [](const std::string& value) {
    return value.empty() ? nlohmann::json(nullptr) : nlohmann::json(value);
  };
  nlohmann::json needed = nlohmann::json::array();
  for (const keel::cli::Resolution& r : report.resolutions) {
    needed.push_back({{"name", r.name},
                      {"libtorch", r.libtorch},
                      {"path", r.path ? nlohmann::json(*r.path) : nlohmann::json(nullptr)},
                      {"via", or_null(r.via)}});
  }
  const keel::cli::PluginNote note = report.file.note.value_or(keel::cli::PluginNote{});
  return {{"plugin", report.path},
          {"release", or_null(note.release)},
          {"flavour", or_null(note.flavour)},
          {"api", or_null(note.api)},
          {"runpath", report.file.runpath},
          {"needed", needed},
          {"problems", report.problems},
          {"ok", report.ok()}};
}

void print_text(const PluginReport& report) {
  const keel::cli::ElfDependencies& file = report.file;
  std::cout << "keel plugin " << report.path << "\n";
  if (file.note) {
    std::cout << "  release:  " << file.note->release << "\n"
              << "  flavour:  " << file.note->flavour << "\n"
              << "  c abi:    " << file.note->api << " (this keel's loader speaks " << kCApiVersion;
    // Not a problem of the file: the loader of the plugin's own keel
    // release takes it. This build's would not.
    unsigned major = 0;
    if (std::sscanf(file.note->api.c_str(), "%u", &major) == 1 && major != KEEL_C_API_MAJOR) {
      std::cout << ", and refuses another major";
    }
    std::cout << ")\n";
  }
  std::string runpath;
  for (const std::string& entry : file.runpath) {
    runpath += (runpath.empty() ? "" : ", ") +
               (entry.empty() ? std::string("'' (the loading process's current folder)") : entry);
  }
  std::cout << "  " << (file.runpath_is_rpath ? "rpath:    " : "runpath:  ")
            << (file.runpath.empty() ? "none" : runpath) << "\n"
            << "  needs:\n";
  std::size_t width = 0;
  for (const keel::cli::Resolution& r : report.resolutions) width = std::max(width, r.name.size());
  for (const keel::cli::Resolution& r : report.resolutions) {
    std::cout << "    " << r.name << std::string(width - r.name.size() + 2, ' ')
              << (r.libtorch ? "libtorch's  " : "            ");
    if (r.path) {
      std::cout << "found " << *r.path << " (" << r.via << ")\n";
    } else {
      std::cout << "not found\n"
                << "      " << (r.libtorch ? kLibtorchHint : kSystemHint) << "\n";
    }
  }
  std::cout << "\n";
  for (const std::string& problem : report.problems) std::cout << "problem: " << problem << "\n";
  if (!report.unresolved_torch.empty()) {
    std::cout << "libtorch's libraries not found here: "
              << absl::StrJoin(report.unresolved_torch, ", ")
              << " (the loader will need their folder; check one with --torch-library-dir DIR)\n";
  }
  if (!report.ok()) {
    std::cout << "not ok: keel's loader would refuse this plugin here\n";
  } else if (!report.unresolved_torch.empty()) {
    std::cout << "ok: the plugin's libraries resolve here, libtorch's aside\n";
  } else {
    std::cout << "ok: the plugin's libraries resolve here\n";
  }
}

int report_plugin(const std::string& path, const std::string& torch_library_dir, bool json) {
  keel::cli::ElfRead read = keel::cli::read_elf_dependencies(path);
  if (!read.error.empty()) {
    std::cerr << "keel-info: " << read.error << "\n";
    if (json) {
      std::cout << nlohmann::json{{"plugin", path}, {"error", read.error}, {"ok", false}}.dump(2)
                << "\n";
    }
    return 2;
  }
  const PluginReport report = examine_plugin(path, std::move(read.file), torch_library_dir);
  if (json) {
    std::cout << to_json(report).dump(2) << "\n";
  } else {
    print_text(report);
  }
  return report.ok() ? 0 : 1;
}

// abseil spells flags as declared (torch_library_dir); keel's documents,
// like most tools, write --torch-library-dir, so that spelling is taken too.
void accept_hyphenated_flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) return;
    char* name = argv[i] + std::strspn(argv[i], "-");
    if (name == argv[i]) continue;
    const std::size_t length = std::strcspn(name, "=");
    if (length == std::strlen("torch-library-dir") &&
        std::strncmp(name, "torch-library-dir", length) == 0) {
      std::replace(name, name + length, '-', '_');
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints what this keel build is: versions, adapters, capabilities; or, with --plugin FILE, "
      "what a keel plugin needs at run time.");
  accept_hyphenated_flags(argc, argv);
  const auto positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::cerr << "keel-info: unexpected argument '" << positional[1] << "'; try --help\n";
    return 2;
  }
  const std::string plugin = absl::GetFlag(FLAGS_plugin);
  const std::string torch_library_dir = absl::GetFlag(FLAGS_torch_library_dir);
  if (plugin.empty() && !torch_library_dir.empty()) {
    std::cerr << "keel-info: --torch-library-dir goes with --plugin FILE\n";
    return 2;
  }
  if (!torch_library_dir.empty() && !std::filesystem::is_directory(torch_library_dir)) {
    std::cerr << "keel-info: --torch-library-dir '" << torch_library_dir << "' is not a folder\n";
    return 2;
  }
  if (!plugin.empty()) return report_plugin(plugin, torch_library_dir, absl::GetFlag(FLAGS_json));
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
