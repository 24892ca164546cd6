#include "residency/component_streamer.h"

#include <algorithm>

#include "util/log.h"

namespace qpool {

ComponentStreamer::ComponentStreamer(Component& component, const StreamPlan& plan,
                                     const ArenaLayout& layout, const torch::Tensor& host,
                                     const c10::Device& device, int prefetch, uint64_t keep_bytes,
                                     ArenaAllocator& arenas, BlockCopier& copier,
                                     StreamOrder& order, std::atomic<uint64_t>& resident)
    : component_(component),
      plan_(plan),
      layout_(layout),
      host_(host),
      device_(device),
      prefetch_(std::max(0, prefetch)),
      arenas_(arenas),
      copier_(copier),
      order_(order),
      resident_(resident),
      host_views_(layout.Views(host)),
      groups_(plan.groups().size()) {
  const int n = static_cast<int>(groups_.size());
  if (static_cast<int>(order_.next.size()) != n) {
    order_.next.resize(n);
    for (int g = 0; g < n; ++g) order_.next[g] = (g + 1) % std::max(n, 1);
    order_.first = 0;
  }
  // Keep the groups that run first: the prefix of the learned order that fits.
  uint64_t kept = 0;
  int g = order_.first;
  for (int i = 0; i < n; ++i, g = order_.next[g]) {
    const StreamGroup& group = plan_.groups()[g];
    const uint64_t size = static_cast<uint64_t>(group.end - group.begin);
    if (groups_[g].keep || kept + size > keep_bytes) break;
    groups_[g].keep = true;
    kept += size;
  }
}

ComponentStreamer::~ComponentStreamer() { Finish(); }

void ComponentStreamer::Fetch(int g) {
  GroupState& state = groups_[g];
  if (state.block) return;
  const StreamGroup& group = plan_.groups()[g];
  const int64_t size = group.end - group.begin;
  auto block = arenas_.Allocate(device_, static_cast<uint64_t>(size), /*pinned=*/false);
  TORCH_CHECK(block.ok(), "streaming '", group.module, "' of component '", component_.name(),
              "': ", block.status().message());
  auto copy = copier_.Copy(block->bytes, host_.narrow(0, group.begin, size));
  TORCH_CHECK(copy.ok(), "streaming '", group.module, "' of component '", component_.name(),
              "': ", copy.status().message());
  state.block = std::move(block).value();
  state.copy = std::move(copy).value();
  resident_bytes_ += static_cast<uint64_t>(size);
  resident_.store(resident_bytes_);
  stats_.peak_bytes = std::max(stats_.peak_bytes, resident_bytes_);
  stats_.bytes_copied += static_cast<uint64_t>(size);
  ++stats_.copies;
}

void ComponentStreamer::Warm() {
  if (groups_.empty()) return;
  int g = order_.first;
  for (int i = 0; i < std::max(prefetch_, 1) && i < static_cast<int>(groups_.size()); ++i) {
    Fetch(g);
    g = order_.next[g];
  }
}

void ComponentStreamer::Enter(const c10::ivalue::Object& module) {
  const int g = plan_.GroupOf(module);
  if (g < 0) return;
  GroupState& state = groups_[g];
  if (state.depth++ > 0) return;  // a nested call of a module already bound
  ++stats_.enters;
  if (last_entered_ >= 0) {
    order_.next[last_entered_] = g;
  } else if (!entered_any_) {
    order_.first = g;
  }
  entered_any_ = true;
  last_entered_ = g;
  if (!state.bound) {
    Fetch(g);
    state.copy.Wait();  // Note [Stream ordering]
    state.copy = PendingCopy();
    const StreamGroup& group = plan_.groups()[g];
    for (size_t s : group.slots) {
      component_.RebindOne(s, layout_.ViewIn(state.block->bytes, s, group.begin));
    }
    state.bound = true;
  }
  // The next `prefetch` groups on the device (kept groups already there do not count).
  const int n = static_cast<int>(groups_.size());
  int ahead = 0;
  for (int next = order_.next[g], steps = 0; ahead < prefetch_ && next != g && steps < n;
       next = order_.next[next], ++steps) {
    if (groups_[next].keep && groups_[next].block) continue;
    Fetch(next);
    ++ahead;
  }
}

void ComponentStreamer::Exit(const c10::ivalue::Object& module) {
  const int g = plan_.GroupOf(module);
  if (g < 0 || groups_[g].depth == 0) return;
  if (--groups_[g].depth == 0 && !groups_[g].keep) Release(g);
}

void ComponentStreamer::Release(int g) {
  GroupState& state = groups_[g];
  if (!state.block) return;
  if (state.bound) {
    for (size_t s : plan_.groups()[g].slots) component_.RebindOne(s, host_views_[s]);
  }
  state.copy.Wait();  // a prefetch never used: its copy precedes the memory's next use
  state.copy = PendingCopy();
  resident_bytes_ -= static_cast<uint64_t>(state.block->bytes.numel());
  resident_.store(resident_bytes_);
  state.block.reset();
  state.depth = 0;
  state.bound = false;
}

void ComponentStreamer::Finish() {
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) Release(g);
}

}  // namespace qpool
