// keel's C++ face over the C ABI compiles in C++17 and C++20 with no
// libtorch header (tests/CMakeLists.txt builds this as an object).
#include <keel/c/keel.hpp>

#if __has_include(<ATen/ATen.h>)
#error "the C++ face's check must see no libtorch header"
#endif
