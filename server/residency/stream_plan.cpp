#include "residency/stream_plan.h"

#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "component/stream_ops.h"
#include "util/log.h"

namespace qpool {
namespace {

using torch::jit::Node;
using torch::jit::Value;

std::string NodeText(const Node* node) {
  std::ostringstream out;
  out << *node;
  std::string text = out.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

bool IsTensorValue(const Value* v) {
  const c10::TypePtr& type = v->type();
  if (type->isSubtypeOf(*c10::TensorType::get())) return true;
  if (auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->isSubtypeOf(*c10::TensorType::get());
  }
  return false;
}

bool HasMethods(const c10::TypePtr& type) {
  auto cls = type->cast<c10::ClassType>();
  return cls != nullptr && !cls->methods().empty();
}

// Whether `object` is `self` or reached from it through GetAttr of containers without methods.
bool ReachedThroughContainers(const Value* object, const Value* self) {
  while (object != self) {
    const Node* node = object->node();
    if (node->kind() != c10::prim::GetAttr) return false;
    object = node->input(0);
    if (object != self && HasMethods(object->type())) return false;
  }
  return true;
}

// The first node of `block` (recursively) that breaks Note [Streaming]'s rules, with why.
const Node* FindUnstreamable(const torch::jit::Block* block, const Value* self, std::string* why) {
  for (const Node* node : block->nodes()) {
    if (node->kind() == c10::prim::GetAttr && IsTensorValue(node->output()) &&
        node->input(0) != self) {
      *why = "reads a tensor of another module";
      return node;
    }
    if (node->kind() == c10::prim::SetAttr && IsTensorValue(node->input(1))) {
      *why = "assigns a tensor attribute";
      return node;
    }
    if (node->kind() == c10::prim::CallMethod && node->input(0) != self) {
      const Value* target = node->input(0);
      if (node->s(c10::attr::name) != "forward" || target->node()->kind() != c10::prim::GetAttr ||
          !ReachedThroughContainers(target->node()->input(0), self)) {
        *why = "calls a submodule other than through a child's forward";
        return node;
      }
    }
    for (const torch::jit::Block* sub : node->blocks()) {
      if (const Node* found = FindUnstreamable(sub, self, why)) return found;
    }
  }
  return nullptr;
}

Status CheckStreamable(const Component& component, const torch::jit::Module& root) {
  std::set<const c10::ClassType*> checked;
  for (const auto& named : root.named_modules()) {
    if (!checked.insert(named.value.type().get()).second) continue;
    for (const auto& method : named.value.get_methods()) {
      const auto graph = method.graph();
      std::string why;
      const Node* node = FindUnstreamable(graph->block(), graph->inputs()[0], &why);
      if (node == nullptr) continue;
      return InvalidArgument(
          StrCat("component '", component.name(), "' cannot be streamed: method '",
                 named.name.empty() ? "" : named.name + ".", method.name(), "' ", why, " (",
                 NodeText(node), "); use the model or none offload policy for it"));
    }
  }
  return Status::Ok();
}

// Inserts qpool::stream_enter(self) first and qpool::stream_exit(self) last into `module`'s
// forward (shared by every module of its type).
void Instrument(const torch::jit::Module& module) {
  RegisterStreamOps();
  const auto graph = module.get_method("forward").graph();
  Value* self = graph->inputs()[0];
  Node* enter =
      graph->create(c10::Symbol::fromQualString("qpool::stream_enter"), {self}, /*num_outputs=*/0);
  Node* first = graph->block()->nodes().front();
  enter->insertBefore(first);
  Node* exit =
      graph->create(c10::Symbol::fromQualString("qpool::stream_exit"), {self}, /*num_outputs=*/0);
  exit->insertBefore(graph->return_node());
  TORCH_CHECK(enter->maybeOperator() != nullptr && exit->maybeOperator() != nullptr,
              "the qpool::stream_enter/exit ops are not registered");
}

struct Splitter {
  const Component& component;
  const std::vector<int64_t>& slot_bytes;
  const uint64_t limit;
  std::map<const c10::ivalue::Object*, std::vector<size_t>> own;  // slots per owner
  std::vector<StreamGroup> groups;
  std::vector<torch::jit::Module> entries;

  uint64_t Bytes(const torch::jit::Module& m) const {
    uint64_t total = 0;
    for (const auto& named : m.named_modules()) {
      auto it = own.find(named.value._ivalue().get());
      if (it == own.end()) continue;
      for (size_t s : it->second) total += static_cast<uint64_t>(slot_bytes[s]);
    }
    return total;
  }

  void AddGroup(const torch::jit::Module& m, const std::string& name, bool subtree) {
    StreamGroup g;
    g.module = name;
    g.entry = m._ivalue().get();
    if (subtree) {
      for (const auto& named : m.named_modules()) {
        auto it = own.find(named.value._ivalue().get());
        if (it != own.end()) g.slots.insert(g.slots.end(), it->second.begin(), it->second.end());
      }
    } else {
      g.slots = own.at(g.entry);
    }
    groups.push_back(std::move(g));
    entries.push_back(m);
  }

  void Split(const torch::jit::Module& m, const std::string& name) {
    const uint64_t bytes = Bytes(m);
    if (bytes == 0) return;
    const bool has_forward = m.find_method("forward").has_value();
    if (has_forward && bytes <= limit) return AddGroup(m, name, /*subtree=*/true);
    // Tensors of a module without methods are never read (CheckStreamable): left unstreamed.
    if (has_forward && own.count(m._ivalue().get()) > 0) AddGroup(m, name, /*subtree=*/false);
    for (const auto& child : m.named_children()) {
      Split(child.value, name.empty() ? child.name : name + "." + child.name);
    }
  }
};

}  // namespace

StatusOr<StreamPlan> StreamPlan::Make(Component& component, const std::vector<int64_t>& slot_bytes,
                                      uint64_t group_bytes) {
  if (slot_bytes.size() != component.num_tensors()) {
    return Internal(StrCat("StreamPlan: ", slot_bytes.size(), " sizes for ",
                           component.num_tensors(), " slots"));
  }
  const torch::jit::Module& root = component.module();
  RETURN_IF_ERROR(CheckStreamable(component, root));
  Splitter splitter{component, slot_bytes, group_bytes, {}, {}, {}};
  for (size_t i = 0; i < component.num_tensors(); ++i) {
    splitter.own[component.slot_owner(i)].push_back(i);
  }
  splitter.Split(root, "");

  StreamPlan plan;
  std::vector<bool> placed(component.num_tensors(), false);
  for (size_t g = 0; g < splitter.groups.size(); ++g) {
    const StreamGroup& group = splitter.groups[g];
    plan.group_of_[group.entry] = static_cast<int>(g);
    for (size_t s : group.slots) {
      plan.slot_order_.push_back(s);
      placed[s] = true;
    }
  }
  for (size_t s = 0; s < placed.size(); ++s) {
    if (!placed[s]) plan.slot_order_.push_back(s);
  }
  plan.groups_ = std::move(splitter.groups);
  try {
    std::set<const c10::ClassType*> instrumented;
    for (const auto& m : splitter.entries) {
      if (instrumented.insert(m.type().get()).second) Instrument(m);
    }
  } catch (const c10::Error& e) {
    return Internal(
        StrCat("component '", component.name(),
               "': instrumenting it for streaming failed: ", e.what_without_backtrace()));
  }
  return plan;
}

void StreamPlan::SetRanges(const ArenaLayout& layout) {
  for (auto& g : groups_) {
    g.begin = g.slots.empty() ? 0 : layout.offset(g.slots.front());
    g.end = g.begin;
    for (size_t s : g.slots) {
      g.begin = std::min(g.begin, layout.offset(s));
      g.end = std::max(g.end, layout.offset(s) + layout.nbytes(s));
    }
  }
}

int StreamPlan::GroupOf(const c10::ivalue::Object& module) const {
  auto it = group_of_.find(&module);
  return it == group_of_.end() ? -1 : it->second;
}

}  // namespace qpool
