// Helpers for the tests of qpool's custom ops: the schema the dispatcher holds and the string the
// exporter registers for tracing, which must be byte-identical; and the bound within which a
// fused CUDA kernel's output matches the unfused ATen operations.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "testing/test_paths.h"

namespace qpool::testing {

// The schema qpool::<name> is registered with, as the dispatcher prints it.
inline std::string RegisteredSchema(const std::string& op) {
  std::ostringstream printed;
  printed << c10::Dispatcher::singleton().findSchemaOrThrow(op.c_str(), "").schema();
  return printed.str();
}

// The string assigned to `constant` in the exporter's `module` (flux_transformer.py unless
// named), on its line or the line after a trailing backslash; "" (and a test failure) when the
// file has none.
inline std::string ExporterSchema(const std::string& constant,
                                  const std::string& module = "flux_transformer.py") {
  const std::string path = SourceDir() + "/tools/qpool_export/qpool_export/" + module;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::string line;
  bool continued = false;
  while (std::getline(in, line)) {
    if (!continued && line.rfind(constant + " = ", 0) != 0) continue;
    const size_t start = line.find('"');
    if (start == std::string::npos) {
      continued = !line.empty() && line.back() == '\\';
      if (!continued) break;
      continue;
    }
    return line.substr(start + 1, line.find('"', start + 1) - start - 1);
  }
  ADD_FAILURE() << "no " << constant << " in " << path;
  return "";
}

// A fused kernel that reduces (a norm's sums) in another order than ATen may round a value one
// unit of its dtype apart, and what follows (a scale, a rotation) carries that unit: the bound is
// relative to the largest magnitude of the last dimension's row.
inline void ExpectCloseToTheUnfusedOps(const at::Tensor& got, const at::Tensor& want,
                                       const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const double tol = got.scalar_type() == at::kFloat  ? 1e-5
                     : got.scalar_type() == at::kHalf ? 4e-3
                                                      : 3.2e-2;
  const at::Tensor diff = (got.to(at::kFloat) - want.to(at::kFloat)).abs();
  const at::Tensor bound = want.to(at::kFloat).abs().amax(-1, /*keepdim=*/true) * tol + tol;
  EXPECT_TRUE(diff.le(bound).all().item<bool>())
      << what << ": max difference " << diff.max().item<float>();
}

}  // namespace qpool::testing
