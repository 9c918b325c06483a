/// @file keel/v1/build_info.h
/// @brief What this keel library is: its version, the libtorch it was built
/// against, and the adapters and capabilities compiled in.
///
/// In one line:
/// `std::cout << keel::build_info().torch_version;`
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp build_info
///
/// `keel-info` prints the same as text or JSON.
#pragma once

#include <string>
#include <vector>

#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {

/// One operation an adapter serves, and under which conditions.
struct CapabilityInfo {
  /// The operation, as keel names it (e.g. "logsumexp").
  std::string operation;
  /// The dtypes it serves ("float32", "bfloat16", ...).
  std::vector<std::string> dtypes;
  /// The device types it serves ("cpu", "cuda").
  std::vector<std::string> devices;
  /// The options it serves natively (e.g. "mask"). An option not listed
  /// sends the call to another adapter under `Backend::automatic`.
  std::vector<std::string> features;
  /// What it runs on, in a sentence (the ATen op or keel kernel).
  std::string implementation;
};

/// One adapter compiled into this build.
struct AdapterInfo {
  /// "compat" or "native".
  std::string name;
  /// What the adapter is, in a sentence.
  std::string description;
  /// The operations it serves.
  std::vector<CapabilityInfo> capabilities;
};

/// Facts about this build of keel.
struct BuildInfo {
  /// keel's version, "MAJOR.MINOR.PATCH".
  std::string keel_version;
  /// The libtorch version built against, e.g. "2.13.0".
  std::string torch_version;
  /// Whether keel was built with CUDA (`KEEL_WITH_CUDA`).
  bool cuda = false;
  /// The compiler keel was built with, e.g. "GNU 12.2.0".
  std::string compiler;
  /// CMake's build type, e.g. "Release".
  std::string build_type;
  /// The adapters compiled in, compat first.
  std::vector<AdapterInfo> adapters;
  /// The C++ standard keel and its consumers compile as (17 or 20): the
  /// oldest that this libtorch's headers accept (20 from libtorch 2.14).
  int cxx_standard = 0;
  /// Every libtorch release keel supports, oldest first, as listed in
  /// `cmake/torch-releases.txt` when this keel was built.
  std::vector<std::string> supported_torch;
  /// How `torch_version` relates to that list: "tested" (listed),
  /// "supported" (a patch release of a listed minor) or "untested" (newer
  /// than every listed release; `scripts/matrix.sh` tests it).
  std::string torch_support;
};

/// keel's version, "MAJOR.MINOR.PATCH", of the library loaded.
KEEL_API const char* version() noexcept;

/// Facts about this build; computed once, then shared. Thread-safe.
KEEL_API const BuildInfo& build_info();

}  // namespace v1
}  // namespace keel
