// The ops an instrumented forward calls at the start and end of each streamed module
// (qpool::stream_enter, qpool::stream_exit), and the per-thread hooks they reach.
#pragma once

#include <ATen/core/ivalue.h>

namespace qpool {

// What the stream ops call. Implemented by ComponentStreamer (residency/component_streamer.h).
// Exceptions thrown here fail the forward like an op's error would (out of memory included).
class StreamHooks {
 public:
  virtual ~StreamHooks() = default;
  // `module`'s forward starts: its streamed tensors must be bound on the device when this returns.
  virtual void Enter(const c10::ivalue::Object& module) = 0;
  // `module`'s forward has queued all its work: its tensors may go.
  virtual void Exit(const c10::ivalue::Object& module) = 0;
};

// Installs `hooks` (may be null: the ops do nothing) for the calling thread until destroyed;
// restores the previous hooks. Component::Forward opens one around each forward.
class StreamHooksScope {
 public:
  explicit StreamHooksScope(StreamHooks* hooks);
  ~StreamHooksScope();
  StreamHooksScope(const StreamHooksScope&) = delete;
  StreamHooksScope& operator=(const StreamHooksScope&) = delete;

 private:
  StreamHooks* previous_;
};

// Registers qpool::stream_enter(Any module) -> () and qpool::stream_exit(Any module) -> () with
// the TorchScript interpreter (once; safe from any thread). Both are side-effecting (conservative
// alias analysis), so no graph pass removes or reorders them.
void RegisterStreamOps();

}  // namespace qpool
