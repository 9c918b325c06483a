// Every public header, compiled on its own in each C++ standard the build's
// libtorch allows (tests/CMakeLists.txt): the headers are valid C++17 and
// C++20 (docs/stability.md), whichever standard keel itself compiles as.
#include <keel/keel.h>
#include <keel/v1/attention.h>
#include <keel/v1/build_info.h>
#include <keel/v1/comm.h>
#include <keel/v1/compat.h>
#include <keel/v1/dispatch.h>
#include <keel/v1/error.h>
#include <keel/v1/export.h>
#include <keel/v1/logsumexp.h>
#include <keel/v1/loss.h>
#include <keel/version.h>
