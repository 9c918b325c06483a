/// @file keel/v1/export.h
/// @brief `KEEL_API`: marks what libkeel exports.
///
/// libkeel is built with `-fvisibility=hidden`: only declarations marked
/// `KEEL_API` are in its dynamic symbol table, so its ABI is exactly the
/// public headers, and `abidiff` against the committed baseline
/// (`abi/`) sees every change to it. Users never write `KEEL_API`
/// themselves; it appears here so that the headers compile on their own.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
/// Gives a declaration default visibility: part of libkeel's ABI.
#define KEEL_API __attribute__((visibility("default")))
#else
/// Gives a declaration default visibility: part of libkeel's ABI.
#define KEEL_API
#endif
