// Compiles a kernel file's vector rows once per x86 vector ISA (no include guard: a kernel file
// includes it once, at file scope, after defining TWE_SIMD_LANES_FILE as its own path):
//
//   #define TWE_SIMD_LANES_FILE "cpu/norm.cc"
//   #include "internal/simd_foreach.h"
//
// For AVX2 and then AVX-512 it opens a `#pragma GCC target` region (so every function parsed
// inside, templates and lambdas included, is compiled for that ISA: GCC lowers vector code by
// the target of the function it is parsed in) and includes internal/simd_lanes.h and
// TWE_SIMD_LANES_FILE with TWE_SIMD_LANES_PASS defined, TWE_SIMD_NS naming the pass's namespace
// (avx2, avx512) and TWE_SIMD_W its fp32 lanes (8, 16). The kernel file guards its vector part
// with `#ifdef TWE_SIMD_LANES_PASS` and the rest with `#ifndef`. Non-x86 builds: nothing.
#if defined(TWE_SIMD_X86)
#define TWE_SIMD_LANES_PASS 1

#pragma GCC push_options
#pragma GCC target("avx2")
#define TWE_SIMD_NS avx2
#define TWE_SIMD_W 8
#include "internal/simd_lanes.h"
#include TWE_SIMD_LANES_FILE
#undef TWE_SIMD_W
#undef TWE_SIMD_NS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#define TWE_SIMD_NS avx512
#define TWE_SIMD_W 16
#include "internal/simd_lanes.h"
#include TWE_SIMD_LANES_FILE
#undef TWE_SIMD_W
#undef TWE_SIMD_NS
#pragma GCC pop_options

#undef TWE_SIMD_LANES_PASS
#endif  // TWE_SIMD_X86
