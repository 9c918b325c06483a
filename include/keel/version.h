/// @file keel/version.h
/// @brief keel's version, as macros usable in the preprocessor.
///
/// This header is the single source of keel's version: CMake reads it to
/// set the project and package versions. Compare against it at compile time
/// with `#if KEEL_VERSION_NUMBER >= 100`; ask `keel::version()` at run time
/// for the version of the library actually loaded.
#pragma once

/// keel's major version: bumped only by a new stable namespace (v2).
#define KEEL_VERSION_MAJOR 0
/// keel's minor version: additions to keel::v1.
#define KEEL_VERSION_MINOR 6
/// keel's patch version: fixes without interface change.
#define KEEL_VERSION_PATCH 0
/// The version as one integer, MAJOR*10000 + MINOR*100 + PATCH.
#define KEEL_VERSION_NUMBER \
  (KEEL_VERSION_MAJOR * 10000 + KEEL_VERSION_MINOR * 100 + KEEL_VERSION_PATCH)
/// The version as a string, "MAJOR.MINOR.PATCH".
#define KEEL_VERSION_STRING "0.6.0"
