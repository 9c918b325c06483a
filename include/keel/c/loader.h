/// @file keel/c/loader.h
/// @brief The loader: finds the keel plugin for the libtorch a service runs
/// on, checks it, and returns its function table.
///
/// `libkeel_loader.so` is small C with no libtorch dependency; a service
/// links it (and only it) and is built once. Plugins are named
/// `libkeel-plugin-<release>-<flavour>.so` (`libkeel-plugin-2.15.0-cpu.so`).
///
/// Which plugin, in order: `plugin_path`; else the environment variable
/// `KEEL_PLUGIN`; else `libkeel-plugin-<torch_release>-<flavour>.so` in
/// `plugin_dir` (else `KEEL_PLUGIN_DIR`, else the loader's own folder).
///
/// Where its libtorch comes from: a process that already runs a libtorch
/// shares it (the release must match); else `torch_library_dir` (else the
/// environment variable `KEEL_TORCH_LIBRARY_DIR`), the folder holding
/// `libtorch_cpu.so` (a wheel's `torch/lib`): the loader opens, from that
/// folder, each library the plugin needs that is there, before the plugin;
/// else the plugin's own search path (`$ORIGIN`) and the system's. An
/// installed plugin names no build folder, so a copied install loads where
/// it is put (`keel-info --plugin PATH` lists what it needs).
///
/// Checks, each failure an error value with the reason, never a crash:
/// - the file is a readable ELF shared object of this machine's class with
///   keel's plugin note (`.keel_plugin`), read before the file is loaded: a
///   missing file is `KEEL_ERRC_IO_ERROR`; a file that is not a plugin, or
///   is truncated, `KEEL_ERRC_CORRUPT_DATA`;
/// - when the process already has a libtorch (a service on PyPI's torch or
///   on `torch::stable`, or a plugin this loader loaded before, even one
///   that failed its checks), the plugin's release must be that libtorch's,
///   by name, before the plugin is loaded;
/// - after `dlopen`: the entry point exists, its table is at least 1.0's
///   size and of this loader's major, and the libtorch actually loaded
///   (`aoti_torch_abi_version()` and its version file) is the release the
///   plugin was built on; any mismatch is `KEEL_ERRC_UNSUPPORTED` naming both.
///
/// A plugin once loaded stays loaded until the process exits (libtorch
/// cannot be unloaded); loading the same path again returns the same table.
/// One libtorch per process: swapping releases means a restart.
// A C header: clang-tidy's C++ checks (using over typedef, <cstdint>) do
// not apply to it.
// NOLINTBEGIN
#ifndef KEEL_C_LOADER_H_
#define KEEL_C_LOADER_H_

#include <stddef.h>
#include <stdint.h>

#include "keel/c/keel.h"

#ifdef __cplusplus
extern "C" {
#endif

/// What `keel_load_plugin` reads and returns. A zeroed struct with its
/// `struct_size` set finds the plugin by `KEEL_PLUGIN`.
typedef struct KEEL_LoadOptions {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const char* plugin_path;               ///< An explicit plugin file, or NULL.
  const char* torch_release;             ///< The release to find a plugin for ("2.13.0"), or NULL.
  const char* flavour;                   ///< "cpu" (NULL) or a CUDA flavour ("cu132").
  const char* plugin_dir;                ///< Where to look by release, or NULL.
  const char* torch_library_dir;         ///< The folder of the plugin's libtorch, or NULL.
  char* error;                           ///< Out: the reason, NUL-terminated, when the call
                                         ///< fails; may be NULL.
  size_t error_capacity;                 ///< The size of `error`'s buffer.
  const KEEL_Api* api;                   ///< Out: the plugin's table.
  const char* resolved_path;             ///< Out: the file loaded (alive until exit).
} KEEL_LoadOptions;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_LoadOptions, resolved_path, resolved_path);

/// Finds, checks and loads a plugin. Returns `KEEL_ERRC_OK` (0) with
/// `options->api` set, or a `KEEL_Errc` with the reason in `options->error`.
/// Thread-safe.
int32_t keel_load_plugin(KEEL_LoadOptions* options);

/// The loader's own C ABI version, `KEEL_C_API_MAJOR * 1000 + KEEL_C_API_MINOR`.
uint32_t keel_loader_version(void);

#ifdef __cplusplus
}
#endif

#endif  // KEEL_C_LOADER_H_
// NOLINTEND
