#include "component/pickle_bounds.h"

#include <cstdint>

#include "util/log.h"

namespace qpool {
namespace {

// How an opcode's argument is laid out.
enum class Arg {
  kNone,
  kFixed,    // `size` bytes
  kCounted,  // a little-endian length of `size` bytes, then that many bytes
  kLine,     // up to a newline
  kTwoLines  // two newline-terminated lines (GLOBAL, INST)
};
struct Layout {
  Arg arg = Arg::kNone;
  int size = 0;
  bool known = false;
};

Layout LayoutOf(uint8_t op) {
  switch (op) {
    // No argument.
    case '(': case '.': case '0': case '1': case '2': case 'N': case ']': case 'a': case 'e':
    case 'l': case ')': case 't': case '}': case 'd': case 's': case 'u': case 'b': case 'R':
    case 'Q': case 'o':
    case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90:
    case 0x91: case 0x92: case 0x93: case 0x94: case 0x97: case 0x98:
      return {Arg::kNone, 0, true};
    // Fixed-size arguments.
    case 'K': case 'h': case 'q': case 0x80: case 0x82:
      return {Arg::kFixed, 1, true};
    case 'M': case 0x83:
      return {Arg::kFixed, 2, true};
    case 'J': case 'j': case 'r': case 0x84:
      return {Arg::kFixed, 4, true};
    case 'G': case 0x95:
      return {Arg::kFixed, 8, true};
    // Counted strings, bytes and integers.
    case 'U': case 'C': case 0x8a: case 0x8c:
      return {Arg::kCounted, 1, true};
    case 'T': case 'X': case 'B': case 0x8b:
      return {Arg::kCounted, 4, true};
    case 0x8d: case 0x8e: case 0x96:
      return {Arg::kCounted, 8, true};
    // Text arguments of protocol 0.
    case 'I': case 'L': case 'S': case 'V': case 'F': case 'P': case 'g': case 'p':
      return {Arg::kLine, 0, true};
    case 'c': case 'i':
      return {Arg::kTwoLines, 0, true};
    default:
      return {};
  }
}

}  // namespace

Status CheckPickleBounds(std::string_view data, const std::string& file,
                         const std::string& record) {
  const size_t n = data.size();
  size_t at = 0;
  auto refuse = [&](size_t offset, const std::string& why) {
    return InvalidArgument(StrCat(file, ": ", record, " byte ", offset, ": ", why,
                                  ": refused before LibTorch's unpickler reads it (Note [Pickle "
                                  "bounds])"));
  };
  while (at < n) {
    const size_t offset = at;
    const auto op = static_cast<uint8_t>(data[at++]);
    const Layout layout = LayoutOf(op);
    if (!layout.known) return refuse(offset, StrCat("opcode 0x", std::hex, int{op}, " is no pickle's"));
    if (op == '.') return Status::Ok();  // STOP: what follows is not read
    const size_t left = n - at;
    switch (layout.arg) {
      case Arg::kNone:
        break;
      case Arg::kFixed:
        if (left < static_cast<size_t>(layout.size)) return refuse(offset, "a truncated argument");
        at += layout.size;
        break;
      case Arg::kCounted: {
        if (left < static_cast<size_t>(layout.size)) return refuse(offset, "a truncated length");
        uint64_t length = 0;
        for (int i = layout.size - 1; i >= 0; --i) {
          length = (length << 8) | static_cast<uint8_t>(data[at + i]);
        }
        at += layout.size;
        if (length > n - at) {
          return refuse(offset, StrCat("a length of ", length, " bytes where ", n - at,
                                       " are left"));
        }
        at += static_cast<size_t>(length);
        break;
      }
      case Arg::kLine:
      case Arg::kTwoLines:
        for (int line = 0; line < (layout.arg == Arg::kTwoLines ? 2 : 1); ++line) {
          const size_t end = data.find('\n', at);
          if (end == std::string_view::npos) return refuse(offset, "an unterminated line");
          at = end + 1;
        }
        break;
    }
  }
  return refuse(n, "no STOP opcode");
}

}  // namespace qpool
