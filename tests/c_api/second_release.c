/* The loader's one-libtorch-per-process rule in a service with no libtorch
   of its own (issue: the check used to look through RTLD_DEFAULT, where a
   plugin's RTLD_LOCAL libtorch is invisible, so a second release's plugin
   was loaded and failed on unresolved symbols, or not at all).

   usage: keel_second_release_test PLUGIN TEMP_DIR

   Loads PLUGIN, then a copy whose note names another release: the copy must
   be refused with KEEL_ERRC_UNSUPPORTED, naming the release already in the
   process, before it is loaded (dlopen RTLD_NOLOAD finds no such object). A
   copy whose note names the same release is accepted. Exit 0 when all hold. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/c/loader.h>

static int failures = 0;
#define CHECK(cond, ...)                         \
  do {                                           \
    if (!(cond)) {                               \
      fprintf(stderr, "second_release: FAIL: "); \
      fprintf(stderr, __VA_ARGS__);              \
      fprintf(stderr, "\n");                     \
      ++failures;                                \
    }                                            \
  } while (0)

static char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* bytes = malloc((size_t)n);
  if (bytes != NULL && fread(bytes, 1, (size_t)n, f) != (size_t)n) {
    free(bytes);
    bytes = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return bytes;
}

/* Writes PLUGIN's bytes to `out` with the note's release changed to `to`
   (same length as the original). */
static int forge(const char* bytes, size_t size, const char* from, const char* to,
                 const char* out) {
  char* copy = malloc(size);
  if (copy == NULL) return 0;
  memcpy(copy, bytes, size);
  const size_t n = strlen(from);
  int replaced = 0;
  for (size_t i = 0; i + n <= size; ++i) {
    if (memcmp(copy + i, from, n) == 0) {
      memcpy(copy + i, to, n);
      replaced = 1;
      break;
    }
  }
  FILE* f = fopen(out, "wb");
  const int ok = replaced && f != NULL && fwrite(copy, 1, size, f) == size;
  if (f != NULL) fclose(f);
  free(copy);
  return ok;
}

static int32_t load(const char* path, char* error, size_t capacity, const KEEL_Api** api) {
  KEEL_LoadOptions o;
  memset(&o, 0, sizeof o);
  o.struct_size = KEEL_LoadOptions_STRUCT_SIZE;
  o.plugin_path = path;
  o.error = error;
  o.error_capacity = capacity;
  const int32_t code = keel_load_plugin(&o);
  *api = o.api;
  return code;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: keel_second_release_test PLUGIN TEMP_DIR\n");
    return 2;
  }
  size_t size = 0;
  char* bytes = read_file(argv[1], &size);
  if (bytes == NULL) {
    fprintf(stderr, "second_release: cannot read %s\n", argv[1]);
    return 2;
  }
  CHECK(dlsym(RTLD_DEFAULT, "aoti_torch_abi_version") == NULL,
        "this test needs a process with no libtorch of its own");
  char error[1024];
  const KEEL_Api* api = NULL;
  int32_t code = load(argv[1], error, sizeof error, &api);
  CHECK(code == KEEL_ERRC_OK && api != NULL, "the plugin itself loads: %s", error);
  KEEL_Plugin_Info_Args info;
  memset(&info, 0, sizeof info);
  info.struct_size = KEEL_Plugin_Info_Args_STRUCT_SIZE;
  CHECK(api != NULL && api->KEEL_Plugin_Info(&info) == NULL, "KEEL_Plugin_Info");
  if (failures > 0) return 1;

  char from[64], to[64], other[4096], same[4096];
  snprintf(from, sizeof from, "release=%s\n", info.torch_release);
  snprintf(to, sizeof to, "%s", from);
  to[8] = to[8] == '9' ? '8' : '9'; /* 2.15.0 -> 9.15.0: the same length */
  snprintf(other, sizeof other, "%s/libkeel-plugin-other-release.so", argv[2]);
  snprintf(same, sizeof same, "%s/libkeel-plugin-same-release.so", argv[2]);
  CHECK(forge(bytes, size, from, to, other), "cannot write %s", other);
  CHECK(forge(bytes, size, from, from, same), "cannot write %s", same);
  free(bytes);

  const KEEL_Api* second = NULL;
  code = load(other, error, sizeof error, &second);
  CHECK(code == KEEL_ERRC_UNSUPPORTED, "another release's plugin: code %d (%s)", code, error);
  char says[128];
  snprintf(says, sizeof says, "already runs libtorch %s", info.torch_release);
  CHECK(strstr(error, says) != NULL, "the reason names the release in the process: %s", error);
  CHECK(dlopen(other, RTLD_NOW | RTLD_NOLOAD) == NULL, "refused before loading, yet loaded");

  code = load(same, error, sizeof error, &second);
  CHECK(code == KEEL_ERRC_OK, "a copy of the same release loads: %s", error);
  if (failures == 0) printf("second_release: refused before loading, with: %s\n", says);
  return failures == 0 ? 0 : 1;
}
