// The kernel contract: every fact that the build, the generators, the runtime, the tuner, the
// tests and the benchmarks share, written once in plain C++ that includes nothing but the public
// enumerations (mha/types.h):
//   - mha_variants.h: which kernels exist (devices, CPU instruction sets, shape buckets, the
//     variant table: mask kind, causal or window, weights returned or not, separate or fused
//     QKV projection, dtype, modified scores);
//   - mha_arguments.h: which arguments each variant takes, in call order, with their names,
//     types and ranks, and the layout of the prepacked weights;
//   - tuned_cpus.h: the CPUs the tuned schedules were measured on, and which tuning and shape
//     bucket each CPU kernel serves.
// The build runs contract/emit_kernels.cpp on it to write the add_halide_library rows and the
// runtime's kernel tables; the generators declare their Inputs and Outputs from
// kernel_arguments(); the runtime checks at compile time that every generated kernel takes
// exactly those arguments (kernel_table.h), so a renamed or reordered Input fails the build.
#pragma once

#include "mha_arguments.h"
#include "mha_variants.h"
#include "tuned_cpus.h"
