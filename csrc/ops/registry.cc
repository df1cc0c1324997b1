#include "ops/registry.h"

namespace twe {
namespace ops {

std::vector<OpEntry>& op_table() {
  static std::vector<OpEntry> table;
  return table;
}

const OpEntry* find_op(std::string_view name) {
  for (const OpEntry& e : op_table())
    if (name == e.name) return &e;
  return nullptr;
}

}  // namespace ops
}  // namespace twe
