// Bounds on a component's TorchScript source, checked before LibTorch's compiler reads it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "util/status.h"

namespace qpool {

// Note [Script source limits]
// torch::jit::load compiles the TorchScript source stored in a component file (its code/*.py
// records) with a recursive-descent parser and emitter that recurse once per level of an
// expression and once per nested block, with no bound of their own: code nesting 100,000
// parentheses overflowed the stack and took the whole server down (SIGSEGV) on a load. A digest
// does not help, since whoever writes the file writes its sha256. So the source is scanned first,
// in one linear pass that recurses on nothing, and a file whose code could recurse deeply is
// refused as INVALID_ARGUMENT naming the file, the record and the line:
//   - the tokens that make a level of the parser's or emitter's recursion (operators, '.',
//     opening brackets, and the keywords not, and, or, if, else, lambda, in, is) counted per
//     logical line (brackets join lines, as in Python), at most kMaxExpressionTokens; a left-
//     associative chain (a + a + ... or a[0][0]...) builds a tree as deep as it is long, so
//     every such token counts, not only nesting;
//   - brackets open at once, at most kMaxBracketDepth (CPython's own parser stops at 200);
//   - indentation levels (nested blocks), at most kMaxBlockDepth;
//   - the source records together, at most kMaxSourceBytes uncompressed.
// What the exporter writes stays far below each bound (its lines are short statements, one
// operation each), and a level's cost in LibTorch's recursion times the bound stays inside a
// thread's stack (bench/results: "TorchScript parser stack per nesting level"); Component::Load
// runs the load on a thread with a larger stack still, for what these bounds let through.
inline constexpr size_t kMaxExpressionTokens = 1000;
inline constexpr size_t kMaxBracketDepth = 200;
inline constexpr size_t kMaxBlockDepth = 100;
inline constexpr size_t kMaxSourceBytes = size_t{64} << 20;

// Ok if `source` (one code record, named `record` in messages, of the component file `file`)
// stays inside the bounds of Note [Script source limits]; InvalidArgument naming the file, record
// and line otherwise.
Status CheckScriptSource(std::string_view source, const std::string& file,
                         const std::string& record);

}  // namespace qpool
