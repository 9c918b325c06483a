// keel's plugin loader (include/keel/c/loader.h): plain C, no libtorch.
//
// The plugin's file is read as ELF before it is loaded, so that a file that
// is not a plugin, or a plugin for another libtorch than the one already in
// the process, is refused before any of its code (static initialisers
// included) runs. Every read of the file is bounds-checked against its size.
#define _GNU_SOURCE
#include "keel/c/loader.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__x86_64__)
#define KEEL_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define KEEL_ELF_MACHINE EM_AARCH64
#else
#error "keel's loader knows x86-64 and aarch64 ELF only"
#endif

#define KEEL_NOTE_SECTION ".keel_plugin"
#define KEEL_NOTE_MAX 4096

// What the plugin's note says (c_api/plugin/plugin.cpp writes it).
// What the plugin's file says: its note and the libraries it needs.
#define KEEL_NEEDED_MAX 64
typedef struct PluginNote {
  char release[32];
  char flavour[32];
  unsigned major, minor;
  char needed[KEEL_NEEDED_MAX][128];  // DT_NEEDED sonames, as far as they fit
  unsigned num_needed;
} PluginNote;

static int32_t fail(KEEL_LoadOptions* o, int32_t code, const char* format, ...) {
  if (o->error != NULL && o->error_capacity > 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(o->error, o->error_capacity, format, args);
    va_end(args);
  }
  return code;
}

// Reads [offset, offset + size) of `f` into `out`; 0 when the range is not
// inside the file.
static int read_at(FILE* f, long file_size, uint64_t offset, void* out, uint64_t size) {
  if (offset > (uint64_t)file_size || size > (uint64_t)file_size - offset) return 0;
  if (fseek(f, (long)offset, SEEK_SET) != 0) return 0;
  return fread(out, 1, size, f) == size;
}

static int note_field(const char* note, const char* key, char* out, size_t capacity) {
  const size_t key_len = strlen(key);
  for (const char* line = note; *line != '\0';) {
    const char* end = strchr(line, '\n');
    const size_t len = end ? (size_t)(end - line) : strlen(line);
    if (len > key_len && strncmp(line, key, key_len) == 0 && line[key_len] == '=') {
      const size_t n = len - key_len - 1;
      if (n + 1 > capacity) return 0;
      memcpy(out, line + key_len + 1, n);
      out[n] = '\0';
      return 1;
    }
    if (end == NULL) break;
    line = end + 1;
  }
  return 0;
}

// Reads the DT_NEEDED names of the dynamic section `dyn` (its strings are in
// the section its sh_link names). 0 when the section is damaged.
static int read_needed(FILE* f, long size, const Elf64_Ehdr* eh, const Elf64_Shdr* dyn,
                       PluginNote* note) {
  Elf64_Shdr strings;
  if (dyn->sh_link >= eh->e_shnum ||
      !read_at(f, size, eh->e_shoff + (uint64_t)dyn->sh_link * sizeof(Elf64_Shdr), &strings,
               sizeof strings)) {
    return 0;
  }
  for (uint64_t at = 0; at + sizeof(Elf64_Dyn) <= dyn->sh_size; at += sizeof(Elf64_Dyn)) {
    Elf64_Dyn d;
    if (!read_at(f, size, dyn->sh_offset + at, &d, sizeof d)) return 0;
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag != DT_NEEDED || note->num_needed == KEEL_NEEDED_MAX) continue;
    char* out = note->needed[note->num_needed];
    const uint64_t offset = d.d_un.d_val;
    if (offset >= strings.sh_size) return 0;
    uint64_t n = strings.sh_size - offset;
    if (n > sizeof note->needed[0]) n = sizeof note->needed[0];
    if (!read_at(f, size, strings.sh_offset + offset, out, n)) return 0;
    if (memchr(out, '\0', n) == NULL) continue;  // a name longer than any soname we open
    ++note->num_needed;
  }
  return 1;
}

// Reads the plugin's note (and what it needs) from its section headers.
static int32_t read_note(KEEL_LoadOptions* o, const char* path, PluginNote* note) {
  struct stat st;
  if (stat(path, &st) != 0) {
    return fail(o, KEEL_ERRC_IO_ERROR, "keel plugin '%s': %s", path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(o, KEEL_ERRC_IO_ERROR, "keel plugin '%s' is not a regular file", path);
  }
  FILE* f = fopen(path, "rb");
  if (f == NULL) return fail(o, KEEL_ERRC_IO_ERROR, "keel plugin '%s': %s", path, strerror(errno));
  const long size = (long)st.st_size;
  Elf64_Ehdr eh;
  int32_t code = KEEL_ERRC_CORRUPT_DATA;
  char text[KEEL_NOTE_MAX + 1];
  if (!read_at(f, size, 0, &eh, sizeof eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    fail(o, code, "keel plugin '%s' is not an ELF file", path);
    goto done;
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != KEEL_ELF_MACHINE ||
      eh.e_type != ET_DYN) {
    fail(o, code, "keel plugin '%s' is not a 64-bit shared object for this machine", path);
    goto done;
  }
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum) {
    fail(o, code, "keel plugin '%s' has no readable section table (truncated?)", path);
    goto done;
  }
  Elf64_Shdr names;
  if (!read_at(f, size, eh.e_shoff + (uint64_t)eh.e_shstrndx * sizeof(Elf64_Shdr), &names,
               sizeof names)) {
    fail(o, code, "keel plugin '%s' is truncated (section table)", path);
    goto done;
  }
  note->num_needed = 0;
  int found = 0;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    char name[sizeof KEEL_NOTE_SECTION];
    if (!read_at(f, size, eh.e_shoff + (uint64_t)i * sizeof(Elf64_Shdr), &sh, sizeof sh)) {
      fail(o, code, "keel plugin '%s' is truncated (section table)", path);
      goto done;
    }
    if (sh.sh_type == SHT_DYNAMIC && !read_needed(f, size, &eh, &sh, note)) {
      fail(o, code, "keel plugin '%s' has a damaged dynamic section", path);
      goto done;
    }
    if (sh.sh_name >= names.sh_size ||
        !read_at(f, size, names.sh_offset + sh.sh_name, name, sizeof name) ||
        memcmp(name, KEEL_NOTE_SECTION, sizeof name) != 0) {
      continue;
    }
    if (sh.sh_size == 0 || sh.sh_size > KEEL_NOTE_MAX ||
        !read_at(f, size, sh.sh_offset, text, sh.sh_size)) {
      fail(o, code, "keel plugin '%s' has a damaged %s note", path, KEEL_NOTE_SECTION);
      goto done;
    }
    text[sh.sh_size] = '\0';
    char version[32];
    if (!note_field(text, "release", note->release, sizeof note->release) ||
        !note_field(text, "flavour", note->flavour, sizeof note->flavour) ||
        !note_field(text, "api", version, sizeof version) ||
        sscanf(version, "%u.%u", &note->major, &note->minor) != 2) {
      fail(o, code, "keel plugin '%s' has a damaged %s note", path, KEEL_NOTE_SECTION);
      goto done;
    }
    found = 1;
  }
  if (found) {
    code = KEEL_ERRC_OK;
  } else {
    fail(o, code, "'%s' is not a keel plugin (no %s note)", path, KEEL_NOTE_SECTION);
  }
done:
  fclose(f);
  return code;
}

// The release of the libtorch in the process (found through `lookup`, a
// dlopen handle or RTLD_DEFAULT), from the C shim's aoti_torch_abi_version():
// [major][minor][patch] in its top three bytes. 0 when there is none.
static int torch_release_in(void* lookup, char* out, size_t capacity, uint64_t* abi) {
  typedef uint64_t AbiVersion(void);
  AbiVersion* fn;
  *(void**)&fn = dlsym(lookup, "aoti_torch_abi_version");
  if (fn == NULL) return 0;
  *abi = fn();
  snprintf(out, capacity, "%u.%u.%u", (unsigned)(*abi >> 56), (unsigned)((*abi >> 48) & 0xff),
           (unsigned)((*abi >> 40) & 0xff));
  return 1;
}

// The version string of the libtorch that defines aoti_torch_abi_version, from
// the files beside its library (a wheel's version.py, a libtorch archive's
// build-version), without its local part ("+cu132"). "" when neither is there.
static void torch_version_file(void* lookup, char* out, size_t capacity) {
  out[0] = '\0';
  void* fn = dlsym(lookup, "aoti_torch_abi_version");
  Dl_info info;
  if (fn == NULL || dladdr(fn, &info) == 0 || info.dli_fname == NULL) return;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", info.dli_fname);
  char* slash = strrchr(dir, '/');
  if (slash == NULL) return;
  *slash = '\0';
  const char* candidates[] = {"../version.py", "../build-version"};
  for (size_t c = 0; c < 2; ++c) {
    char file[PATH_MAX + 32];
    snprintf(file, sizeof file, "%s/%s", dir, candidates[c]);
    FILE* f = fopen(file, "r");
    if (f == NULL) continue;
    char line[256];
    while (fgets(line, sizeof line, f) != NULL) {
      const char* v = line;
      if (c == 0) {
        if (strncmp(line, "__version__", 11) != 0) continue;
        v = strchr(line, '\'');
        if (v == NULL) v = strchr(line, '"');
        if (v == NULL) continue;
        ++v;
      }
      size_t n = strcspn(v, "+'\"\n ");
      if (n >= capacity) n = capacity - 1;
      memcpy(out, v, n);
      out[n] = '\0';
      break;
    }
    fclose(f);
    if (out[0] != '\0') return;
  }
}

// Plugins loaded so far: a plugin is never unloaded, and loading it again
// returns its table.
typedef struct Loaded {
  char* path;
  char release[32];
  const KEEL_Api* api;
  struct Loaded* next;
} Loaded;
static Loaded* loaded_plugins = NULL;
// The libtorch release this loader brought into the process: set as soon as
// a plugin's dlopen succeeds, whether or not the plugin then passes its
// checks, because its libtorch stays (loaded RTLD_LOCAL, it is invisible to
// RTLD_DEFAULT, so this is the only record of it).
static char process_release[32];
static pthread_mutex_t loaded_lock = PTHREAD_MUTEX_INITIALIZER;

// Opens, from `dir`, each library the plugin needs that is there, so that
// the plugin's own lookup finds them loaded (by soname) wherever its
// RUNPATH points. A library that fails to open is an error naming it.
static int32_t open_torch_libraries(KEEL_LoadOptions* o, const char* dir, const PluginNote* note) {
  for (unsigned i = 0; i < note->num_needed; ++i) {
    char file[PATH_MAX];
    const int n = snprintf(file, sizeof file, "%s/%s", dir, note->needed[i]);
    if (n < 0 || (size_t)n >= sizeof file) {
      return fail(o, KEEL_ERRC_INVALID_ARGUMENT, "keel: torch_library_dir is too long");
    }
    struct stat st;
    if (stat(file, &st) != 0) continue;
    if (dlopen(file, RTLD_NOW | RTLD_LOCAL) == NULL) {
      const char* why = dlerror();
      return fail(o, KEEL_ERRC_UNSUPPORTED, "keel: '%s' does not load: %s", file,
                  why ? why : "unknown reason");
    }
  }
  return KEEL_ERRC_OK;
}

static int32_t resolve_path(KEEL_LoadOptions* o, char* out, size_t capacity) {
  const char* explicit_path = o->plugin_path;
  if (explicit_path == NULL || explicit_path[0] == '\0') explicit_path = getenv("KEEL_PLUGIN");
  if (explicit_path != NULL && explicit_path[0] != '\0') {
    if (strlen(explicit_path) >= capacity) {
      return fail(o, KEEL_ERRC_INVALID_ARGUMENT, "keel plugin path is too long");
    }
    snprintf(out, capacity, "%s", explicit_path);
    return KEEL_ERRC_OK;
  }
  if (o->torch_release == NULL || o->torch_release[0] == '\0') {
    return fail(o, KEEL_ERRC_INVALID_ARGUMENT,
                "keel_load_plugin: no plugin_path, no KEEL_PLUGIN and no torch_release to find "
                "one by");
  }
  const char* flavour = (o->flavour != NULL && o->flavour[0] != '\0') ? o->flavour : "cpu";
  char dir[PATH_MAX];
  const char* d = o->plugin_dir;
  if (d == NULL || d[0] == '\0') d = getenv("KEEL_PLUGIN_DIR");
  if (d == NULL || d[0] == '\0') {
    Dl_info info;
    if (dladdr(&loaded_lock, &info) == 0 || info.dli_fname == NULL) {
      return fail(o, KEEL_ERRC_IO_ERROR, "keel_load_plugin: cannot find the loader's own folder");
    }
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char* slash = strrchr(dir, '/');
    if (slash != NULL) {
      *slash = '\0';
    } else {
      snprintf(dir, sizeof dir, ".");
    }
    d = dir;
  }
  const int n = snprintf(out, capacity, "%s/libkeel-plugin-%s-%s.so", d, o->torch_release, flavour);
  if (n < 0 || (size_t)n >= capacity) {
    return fail(o, KEEL_ERRC_INVALID_ARGUMENT, "keel plugin path is too long");
  }
  return KEEL_ERRC_OK;
}

static int32_t load_locked(KEEL_LoadOptions* o) {
  char path[PATH_MAX];
  int32_t code = resolve_path(o, path, sizeof path);
  if (code != KEEL_ERRC_OK) return code;
  char real[PATH_MAX];
  if (realpath(path, real) == NULL) {
    return fail(o, KEEL_ERRC_IO_ERROR, "keel plugin '%s': %s", path, strerror(errno));
  }
  for (Loaded* l = loaded_plugins; l != NULL; l = l->next) {
    if (strcmp(l->path, real) == 0) {
      if (o->torch_release != NULL && o->torch_release[0] != '\0' &&
          strcmp(o->torch_release, l->release) != 0) {
        return fail(o, KEEL_ERRC_UNSUPPORTED,
                    "keel plugin '%s' is built for libtorch %s, not the %s asked for", real,
                    l->release, o->torch_release);
      }
      o->api = l->api;
      o->resolved_path = l->path;
      return KEEL_ERRC_OK;
    }
  }
  PluginNote note;
  code = read_note(o, real, &note);
  if (code != KEEL_ERRC_OK) return code;
  if (note.major != KEEL_C_API_MAJOR) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "keel plugin '%s' speaks keel's C ABI %u.%u; this loader speaks %u.x", real,
                note.major, note.minor, (unsigned)KEEL_C_API_MAJOR);
  }
  if (o->torch_release != NULL && o->torch_release[0] != '\0' &&
      strcmp(o->torch_release, note.release) != 0) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "keel plugin '%s' is built for libtorch %s, not the %s asked for", real,
                note.release, o->torch_release);
  }
  if (process_release[0] != '\0' && strcmp(process_release, note.release) != 0) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "this process already runs libtorch %s, loaded for an earlier keel plugin; keel "
                "plugin '%s' is built for libtorch %s (one libtorch per process: load the %s "
                "plugin)",
                process_release, real, note.release, process_release);
  }
  char present[32];
  uint64_t abi = 0;
  const int has_torch = torch_release_in(RTLD_DEFAULT, present, sizeof present, &abi);
  if (has_torch && strcmp(present, note.release) != 0) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "this process already runs libtorch %s; keel plugin '%s' is built for libtorch "
                "%s (one libtorch per process: load the %s plugin)",
                present, real, note.release, present);
  }
  // A libtorch already in the process is the plugin's: opening another copy
  // by path would load a second one beside it (a path is not matched by
  // soname), so the folder is used only by a process that has none.
  const char* torch_dir = o->torch_library_dir;
  if (torch_dir == NULL || torch_dir[0] == '\0') torch_dir = getenv("KEEL_TORCH_LIBRARY_DIR");
  if (!has_torch && process_release[0] == '\0' && torch_dir != NULL && torch_dir[0] != '\0') {
    code = open_torch_libraries(o, torch_dir, &note);
    if (code != KEEL_ERRC_OK) return code;
  }
  void* handle = dlopen(real, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    const char* why = dlerror();
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "keel plugin '%s' does not load: %s (its libtorch is found through "
                "torch_library_dir or KEEL_TORCH_LIBRARY_DIR, a libtorch already in the process, "
                "or the library path; keel-info --plugin lists what it needs)",
                real, why ? why : "unknown reason");
  }
  snprintf(process_release, sizeof process_release, "%s", note.release);
  // From here on the plugin stays loaded, whatever the checks find: its
  // libtorch may have started threads, and cannot be unloaded.
  KEEL_GetApi_Fn* get_api;
  *(void**)&get_api = dlsym(handle, KEEL_PLUGIN_ENTRY_POINT);
  if (get_api == NULL) {
    return fail(o, KEEL_ERRC_CORRUPT_DATA, "keel plugin '%s' has no %s", real,
                KEEL_PLUGIN_ENTRY_POINT);
  }
  const KEEL_Api* api = get_api();
  const size_t minimum = KEEL_Api_MIN_SIZE;
  if (api == NULL || api->struct_size < KEEL_STRUCT_SIZE(KEEL_Api, api_version) ||
      api->api_version.major != KEEL_C_API_MAJOR || api->struct_size < minimum) {
    return fail(o, KEEL_ERRC_CORRUPT_DATA,
                "keel plugin '%s' returned no usable table (size %zu, C ABI %u.%u; this loader "
                "needs %u.x of at least %zu bytes)",
                real, api ? api->struct_size : (size_t)0, api ? api->api_version.major : 0u,
                api ? api->api_version.minor : 0u, (unsigned)KEEL_C_API_MAJOR, minimum);
  }
  if (!torch_release_in(handle, present, sizeof present, &abi)) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "keel plugin '%s' loaded no libtorch with aoti_torch_abi_version", real);
  }
  if (strcmp(present, note.release) != 0) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "keel plugin '%s' is built for libtorch %s, but the libtorch loaded is %s", real,
                note.release, present);
  }
  char version[64];
  torch_version_file(handle, version, sizeof version);
  if (version[0] != '\0' && strcmp(version, note.release) != 0) {
    return fail(o, KEEL_ERRC_UNSUPPORTED,
                "keel plugin '%s' is built for libtorch %s, but the loaded libtorch's version "
                "file says %s",
                real, note.release, version);
  }
  Loaded* entry = (Loaded*)malloc(sizeof *entry);
  char* kept = strdup(real);
  if (entry == NULL || kept == NULL) {
    free(entry);
    free(kept);
    return fail(o, KEEL_ERRC_BACKEND_ERROR, "keel_load_plugin: out of memory");
  }
  entry->path = kept;
  snprintf(entry->release, sizeof entry->release, "%s", note.release);
  entry->api = api;
  entry->next = loaded_plugins;
  loaded_plugins = entry;
  o->api = api;
  o->resolved_path = kept;
  return KEEL_ERRC_OK;
}

int32_t keel_load_plugin(KEEL_LoadOptions* options) {
  if (options == NULL) return KEEL_ERRC_INVALID_ARGUMENT;
  // A struct smaller than 1.0's may not even hold `error`: the code alone says it.
  if (options->struct_size < KEEL_LoadOptions_MIN_SIZE) {
    return KEEL_ERRC_INVALID_ARGUMENT;
  }
  options->api = NULL;
  options->resolved_path = NULL;
  if (options->error != NULL && options->error_capacity > 0) options->error[0] = '\0';
  pthread_mutex_lock(&loaded_lock);
  const int32_t code = load_locked(options);
  pthread_mutex_unlock(&loaded_lock);
  return code;
}

uint32_t keel_loader_version(void) {
  return KEEL_C_API_MAJOR * 1000u + KEEL_C_API_MINOR;
}
