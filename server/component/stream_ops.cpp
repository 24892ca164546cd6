#include "component/stream_ops.h"

#include <torch/csrc/jit/runtime/custom_operator.h>

#include <mutex>

namespace qpool {
namespace {

thread_local StreamHooks* current_hooks = nullptr;

template <bool kEnter>
void StreamOp(torch::jit::Stack& stack) {
  c10::IValue module = torch::jit::pop(stack);
  if (current_hooks == nullptr || !module.isObject()) return;
  const c10::ivalue::Object& object = module.toObjectRef();
  if (kEnter) {
    current_hooks->Enter(object);
  } else {
    current_hooks->Exit(object);
  }
}

}  // namespace

StreamHooksScope::StreamHooksScope(StreamHooks* hooks) : previous_(current_hooks) {
  current_hooks = hooks;
}

StreamHooksScope::~StreamHooksScope() { current_hooks = previous_; }

void RegisterStreamOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::jit::RegisterOperators ops({
        torch::jit::Operator("qpool::stream_enter(Any module) -> ()", StreamOp<true>,
                             c10::AliasAnalysisKind::CONSERVATIVE),
        torch::jit::Operator("qpool::stream_exit(Any module) -> ()", StreamOp<false>,
                             c10::AliasAnalysisKind::CONSERVATIVE),
    });
    (void)ops;
  });
}

}  // namespace qpool
