/// @file keel/keel.h
/// @brief The one header a keel user includes.
///
/// @snippet examples/snippets/header_snippets.cpp keel_h
///
/// Everything public lives in `keel::v1`, an inline namespace: write
/// `keel::logsumexp`, and the stable v1 name is what you get.
#pragma once

#include "keel/v1/attention.h"
#include "keel/v1/build_info.h"
#include "keel/v1/comm.h"
#include "keel/v1/compat.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/dtype.h"
#include "keel/v1/error.h"
#include "keel/v1/logsumexp.h"
#include "keel/v1/loss.h"
#include "keel/version.h"
