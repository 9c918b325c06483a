// A stand-in for Debian's libtorch-dev 1.13: only the version header, which
// is all keel's configure reads before refusing it.
#pragma once
#define TORCH_VERSION_MAJOR 1
#define TORCH_VERSION_MINOR 13
#define TORCH_VERSION_PATCH 1
#define TORCH_VERSION "1.13.1"
