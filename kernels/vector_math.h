// ATen's vector math, made ready before keel's first call.
#pragma once

namespace keel::kernels {

// Runs ATen's CPU exp, log and tanh once on a few float32 and float64
// elements, on the calling thread, the first time it is called in a process
// (later calls return at once; safe from any thread).
//
// Why: ATen computes these on float and double through MKL's vector math
// (vmsExp and its kin, in high-accuracy mode). When the first exp of a
// process was split across two intra-op threads, the worker thread's half
// came out at about 12 bits (relative error 1.5e-4 against 1e-7): 8 of 600
// fresh processes, libtorch 2.15.0 at 2 threads, always the first call,
// always the second thread's share; 0 of 600 once one call had run whole
// first. It cost keel's decode kernel 100 times the float32 error of a
// naive implementation on a process's first call (issue 20's
// "multi-thread decode defect"). Each adapter calls this when it is made,
// before it serves anything.
void settle_vector_math();

}  // namespace keel::kernels
