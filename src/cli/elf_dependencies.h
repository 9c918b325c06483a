// What a shared object asks of the dynamic linker, read from its file without
// loading it: keel's plugin note, its DT_NEEDED libraries and its
// DT_RUNPATH (or DT_RPATH), and where each library would resolve here.
//
// keel-info --plugin uses it to say why a plugin will not load before anyone
// tries: dlopen would run nothing of a plugin whose libtorch is absent, and
// its error names only the first library missing.
//
//   keel::cli::ElfRead read = keel::cli::read_elf_dependencies(path);
//   if (!read.error.empty()) return fail(read.error);
//   keel::cli::SearchOptions search;
//   search.origin = keel::cli::origin_of(path);
//   const char* ld_library_path = std::getenv("LD_LIBRARY_PATH");
//   search.ld_library_path = ld_library_path != nullptr ? ld_library_path : "";
//   search.cache = keel::cli::ldconfig_cache();
//   for (const keel::cli::Resolution& r : keel::cli::resolve(read.file, search)) ...
//
// Every read of the file is bounds-checked against its size, as in
// c_api/loader/loader.c: a truncated or garbage file is an error value, never
// a crash. Only 64-bit little-endian objects of this machine are read; the
// libraries' own dependencies are not followed.
#pragma once

#include <elf.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace keel::cli {

#if defined(__x86_64__)
inline constexpr std::uint16_t kElfMachine = EM_X86_64;
inline constexpr std::array<const char*, 6> kDefaultLibraryDirs = {"/lib/x86_64-linux-gnu",
                                                                   "/usr/lib/x86_64-linux-gnu",
                                                                   "/lib64",
                                                                   "/usr/lib64",
                                                                   "/lib",
                                                                   "/usr/lib"};
#elif defined(__aarch64__)
inline constexpr std::uint16_t kElfMachine = EM_AARCH64;
inline constexpr std::array<const char*, 6> kDefaultLibraryDirs = {"/lib/aarch64-linux-gnu",
                                                                   "/usr/lib/aarch64-linux-gnu",
                                                                   "/lib64",
                                                                   "/usr/lib64",
                                                                   "/lib",
                                                                   "/usr/lib"};
#else
#error "keel-info reads x86-64 and aarch64 ELF only, as keel's loader does"
#endif

// The section c_api/plugin/plugin.cpp writes; the loader refuses a file
// without it.
inline constexpr std::string_view kPluginNoteSection = ".keel_plugin";
// The loader's bound (KEEL_NOTE_MAX): a larger note is damaged.
inline constexpr std::uint64_t kPluginNoteMax = 4096;

// The `key=value` lines of a plugin's note; a field the note lacks is empty.
struct PluginNote {
  std::string release;  // "2.15.0"
  std::string flavour;  // "cpu", "cu132"
  std::string api;      // keel's C ABI, "major.minor"
};

struct ElfDependencies {
  // nullopt when the file has no .keel_plugin section: not a keel plugin.
  std::optional<PluginNote> note;
  std::vector<std::string> needed;
  // The entries as written, $ORIGIN unexpanded; an empty one is the current
  // folder of the process that loads the object.
  std::vector<std::string> runpath;
  // The list came from DT_RPATH (the object has no DT_RUNPATH), which the
  // linker searches before LD_LIBRARY_PATH instead of after it.
  bool runpath_is_rpath = false;
};

struct ElfRead {
  ElfDependencies file;
  std::string error;  // empty when the file was read
};

// The value of `key` in a note's text, or "" when absent.
inline std::string plugin_note_field(std::string_view text, std::string_view key) {
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == '=') {
      return std::string(line.substr(key.size() + 1));
    }
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return "";
}

namespace elf_detail {

class BoundedFile {
 public:
  explicit BoundedFile(const std::string& path) : in_(path, std::ios::binary) {
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && in_) size_ = size;
  }

  bool is_open() const { return size_.has_value(); }

  // Reads [offset, offset + size) into `out`; false when the range is not
  // inside the file. The subtraction form cannot overflow on hostile offsets.
  bool read(std::uint64_t offset, void* out, std::uint64_t size) {
    if (!size_ || offset > *size_ || size > *size_ - offset) return false;
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(size));
    return static_cast<std::uint64_t>(in_.gcount()) == size;
  }

  bool read(std::uint64_t offset, std::uint64_t size, std::string* out) {
    if (!size_ || offset > *size_ || size > *size_ - offset) return false;
    out->resize(size);
    return read(offset, out->data(), size);
  }

 private:
  std::ifstream in_;
  std::optional<std::uintmax_t> size_;
};

// Whether `header` describes what this machine's dynamic linker would load.
inline bool is_native_shared_object(const Elf64_Ehdr& header) {
  return std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 &&
         header.e_ident[EI_CLASS] == ELFCLASS64 && header.e_ident[EI_DATA] == ELFDATA2LSB &&
         header.e_machine == kElfMachine && header.e_type == ET_DYN;
}

// The NUL-terminated string at `offset` of a string table; nullopt when it
// does not end inside the table.
inline std::optional<std::string> table_string(const std::string& table, std::uint64_t offset) {
  if (offset >= table.size()) return std::nullopt;
  const std::size_t end = table.find('\0', offset);
  if (end == std::string::npos) return std::nullopt;
  return table.substr(offset, end - offset);
}

inline std::vector<std::string> split_path_list(std::string_view list,
                                                std::string_view separators) {
  std::vector<std::string> parts;
  while (true) {
    const std::size_t end = list.find_first_of(separators);
    parts.emplace_back(list.substr(0, end));
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return parts;
}

}  // namespace elf_detail

// Reads the note, DT_NEEDED and DT_RUNPATH/DT_RPATH of the file at `path`
// through its section headers.
inline ElfRead read_elf_dependencies(const std::string& path) {
  ElfRead result;
  auto fail = [&](const std::string& why) {
    result.error = "'" + path + "' " + why;
    return result;
  };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return fail(std::filesystem::exists(path, ec) ? "is not a regular file" : "does not exist");
  }
  elf_detail::BoundedFile f(path);
  if (!f.is_open()) return fail("cannot be read");

  Elf64_Ehdr eh;
  if (!f.read(0, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    return fail("is not an ELF file");
  }
  if (!elf_detail::is_native_shared_object(eh)) {
    return fail("is not a 64-bit shared object for this machine");
  }
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum) {
    return fail("has no readable section table (truncated, or stripped of its sections?)");
  }
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  if (!f.read(eh.e_shoff, sections.data(), sections.size() * sizeof(Elf64_Shdr))) {
    return fail("is truncated (its section table lies past its end)");
  }
  std::string names;
  const Elf64_Shdr& names_header = sections[eh.e_shstrndx];
  if (!f.read(names_header.sh_offset, names_header.sh_size, &names)) {
    return fail("is truncated (its section names lie past its end)");
  }

  const Elf64_Shdr* dynamic = nullptr;
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type == SHT_DYNAMIC && dynamic == nullptr) dynamic = &sh;
    if (elf_detail::table_string(names, sh.sh_name) != kPluginNoteSection) continue;
    std::string text;
    if (!f.read(sh.sh_offset, sh.sh_size, &text)) {
      return fail("is truncated (its .keel_plugin note lies past its end)");
    }
    // As the loader does: an empty or oversized note is read as having no
    // fields, and the caller reports it as damaged.
    PluginNote note;
    if (sh.sh_size > 0 && sh.sh_size <= kPluginNoteMax) {
      text = text.substr(0, text.find('\0'));
      note.release = plugin_note_field(text, "release");
      note.flavour = plugin_note_field(text, "flavour");
      note.api = plugin_note_field(text, "api");
    }
    result.file.note = note;
  }
  if (dynamic == nullptr) return fail("has no dynamic section: it is not a shared object");
  if (dynamic->sh_link >= sections.size()) return fail("has a damaged dynamic section");
  const Elf64_Shdr& strings_header = sections[dynamic->sh_link];
  std::string strings;
  std::string entries_bytes;
  if (!f.read(strings_header.sh_offset, strings_header.sh_size, &strings) ||
      !f.read(dynamic->sh_offset, dynamic->sh_size, &entries_bytes)) {
    return fail("is truncated (its dynamic section lies past its end)");
  }

  std::optional<std::string> runpath;
  std::optional<std::string> rpath;
  for (std::size_t at = 0; at + sizeof(Elf64_Dyn) <= entries_bytes.size();
       at += sizeof(Elf64_Dyn)) {
    Elf64_Dyn entry;
    std::memcpy(&entry, entries_bytes.data() + at, sizeof entry);
    if (entry.d_tag == DT_NULL) break;
    if (entry.d_tag != DT_NEEDED && entry.d_tag != DT_RUNPATH && entry.d_tag != DT_RPATH) continue;
    std::optional<std::string> value = elf_detail::table_string(strings, entry.d_un.d_val);
    if (!value) return fail("has a damaged dynamic string table");
    if (entry.d_tag == DT_NEEDED) {
      result.file.needed.push_back(std::move(*value));
    } else if (entry.d_tag == DT_RUNPATH) {
      runpath = std::move(value);
    } else {
      rpath = std::move(value);
    }
  }
  // ld.so ignores DT_RPATH when DT_RUNPATH is present.
  if (runpath) {
    result.file.runpath = elf_detail::split_path_list(*runpath, ":");
  } else if (rpath) {
    result.file.runpath = elf_detail::split_path_list(*rpath, ":");
    result.file.runpath_is_rpath = true;
  }
  return result;
}

// Whether `name` is one of libtorch's libraries (its own, or CUDA's and
// OpenMP's that its wheels and archives ship beside it): those the loader
// finds through its libtorch folder rather than the system's.
inline bool is_libtorch_library(std::string_view name) {
  constexpr std::array<std::string_view, 9> kPrefixes = {"libtorch", "libc10",    "libshm",
                                                         "libgomp",  "libcudart", "libnvrtc",
                                                         "libcu",    "libnccl",   "libnv"};
  for (std::string_view prefix : kPrefixes) {
    if (name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

// The folder $ORIGIN names for the object at `path`. keel's loader dlopens
// the realpath of a plugin, so symbolic links are resolved first.
inline std::string origin_of(const std::string& path) {
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (ec) real = std::filesystem::absolute(path, ec);
  return real.parent_path().string();
}

// `entry` with $ORIGIN and ${ORIGIN} replaced by `origin`. ld.so reads
// "$ORIGINAL" as the token $ORIGINAL, not $ORIGIN followed by "AL".
inline std::string expand_origin(std::string_view entry, const std::string& origin) {
  std::string out;
  while (!entry.empty()) {
    if (entry.substr(0, 9) == "${ORIGIN}") {
      out += origin;
      entry.remove_prefix(9);
      continue;
    }
    if (entry.substr(0, 7) == "$ORIGIN") {
      const char next = entry.size() > 7 ? entry[7] : '\0';
      const bool identifier = next == '_' || (next >= 'a' && next <= 'z') ||
                              (next >= 'A' && next <= 'Z') || (next >= '0' && next <= '9');
      if (!identifier) {
        out += origin;
        entry.remove_prefix(7);
        continue;
      }
    }
    out += entry.front();
    entry.remove_prefix(1);
  }
  return out;
}

// The (name, path) entries of the dynamic linker's cache, in its order, from
// `ldconfig -p`; empty when ldconfig cannot be run, and the default folders
// then stand alone.
inline std::vector<std::pair<std::string, std::string>> ldconfig_cache() {
  std::vector<std::pair<std::string, std::string>> cache;
  // /sbin is often outside a user's PATH.
  FILE* pipe = popen("ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null", "r");
  if (pipe == nullptr) return cache;
  std::string line;
  char chunk[512];
  while (std::fgets(chunk, sizeof chunk, pipe) != nullptr) {
    line += chunk;
    if (line.back() != '\n') continue;
    line.pop_back();
    // "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"
    const std::size_t arrow = line.find(" => ");
    const std::size_t start = line.find_first_not_of(" \t");
    if (arrow != std::string::npos && start < arrow) {
      const std::size_t name_end = line.find_first_of(" \t", start);
      cache.emplace_back(line.substr(start, name_end - start), line.substr(arrow + 4));
    }
    line.clear();
  }
  pclose(pipe);
  return cache;
}

// Where to look, beyond the object's own RUNPATH.
struct SearchOptions {
  std::string origin;             // what $ORIGIN expands to: origin_of(path)
  std::string torch_library_dir;  // searched first for libtorch's libraries, when set
  std::string ld_library_path;    // as in the environment
  std::vector<std::pair<std::string, std::string>> cache;  // ldconfig_cache()
  std::vector<std::string> default_dirs{kDefaultLibraryDirs.begin(), kDefaultLibraryDirs.end()};
};

struct Resolution {
  std::string name;
  bool libtorch = false;  // is_libtorch_library(name)
  std::optional<std::string> path;
  std::string via;  // where `path` was found: "RUNPATH", "LD_LIBRARY_PATH", ...
};

// Whether the file at `path` is one the dynamic linker would take: ld.so
// passes over a 32-bit or foreign library of the right name and searches on.
inline bool is_loadable_library(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  elf_detail::BoundedFile f(path);
  Elf64_Ehdr eh;
  return f.read(0, &eh, sizeof eh) && elf_detail::is_native_shared_object(eh);
}

// Where each of `file`'s DT_NEEDED libraries resolves, in ld.so's order
// (glibc's dl-load.c): a name with a slash as it is; then DT_RPATH, when the
// object has no DT_RUNPATH; LD_LIBRARY_PATH; DT_RUNPATH; the cache; the
// default folders. libtorch's libraries are looked for in
// `torch_library_dir` before all of these, since the loader loads them from
// there before the plugin, and ld.so then matches them by soname.
inline std::vector<Resolution> resolve(const ElfDependencies& file, const SearchOptions& options) {
  std::vector<std::string> runpath;
  for (const std::string& entry : file.runpath) {
    runpath.push_back(expand_origin(entry, options.origin));
  }
  // LD_LIBRARY_PATH takes ';' as well as ':' between entries.
  const std::vector<std::string> ld_library_path =
      options.ld_library_path.empty() ? std::vector<std::string>{}
                                      : elf_detail::split_path_list(options.ld_library_path, ":;");

  std::vector<Resolution> resolutions;
  for (const std::string& name : file.needed) {
    Resolution r{name, is_libtorch_library(name), std::nullopt, ""};
    auto try_path = [&](const std::string& candidate, const char* via) {
      if (r.path || !is_loadable_library(candidate)) return;
      r.path = candidate;
      r.via = via;
    };
    // An empty entry is the current folder, as ld.so reads it; path's
    // operator/ keeps `name` alone then.
    auto try_dirs = [&](const std::vector<std::string>& dirs, const char* via) {
      for (const std::string& dir : dirs) {
        try_path((std::filesystem::path(dir) / name).string(), via);
      }
    };
    if (name.find('/') != std::string::npos) {
      try_path(name, "its path");
      resolutions.push_back(std::move(r));
      continue;
    }
    if (r.libtorch && !options.torch_library_dir.empty()) {
      try_path((std::filesystem::path(options.torch_library_dir) / name).string(),
               "--torch-library-dir");
    }
    if (file.runpath_is_rpath) try_dirs(runpath, "RPATH");
    try_dirs(ld_library_path, "LD_LIBRARY_PATH");
    if (!file.runpath_is_rpath) try_dirs(runpath, "RUNPATH");
    for (const auto& [cached_name, cached_path] : options.cache) {
      if (cached_name == name) try_path(cached_path, "ld.so cache");
    }
    try_dirs(options.default_dirs, "default folders");
    resolutions.push_back(std::move(r));
  }
  return resolutions;
}

}  // namespace keel::cli
