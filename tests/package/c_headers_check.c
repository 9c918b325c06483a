/* keel's C ABI headers compile as C11 with DLPack's header only
   (tests/CMakeLists.txt builds this as an object, a build error if not). */
#include <keel/c/keel.h>
#include <keel/c/loader.h>

/* The bootstrap, frozen forever: struct_size, extension_start, api_version. */
_Static_assert(offsetof(KEEL_Api, struct_size) == 0, "KEEL_Api bootstrap moved");
_Static_assert(offsetof(KEEL_Api, api_version) == 2 * sizeof(void*), "KEEL_Api bootstrap moved");
