#include "component/script_source_limits.h"

#include <vector>

#include "util/log.h"

namespace qpool {
namespace {

bool IsIdentifierStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;  // UTF-8 in identifiers: not a token we count
}
bool IsIdentifierChar(char c) { return IsIdentifierStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsOperator(char c) {
  switch (c) {
    case '+': case '-': case '*': case '/': case '%': case '~': case '<': case '>': case '=':
    case '!': case '&': case '|': case '^': case '@': case '.':
      return true;
    default:
      return false;
  }
}
// The keywords that make an expression node with operands (Note [Script source limits]).
bool IsOperatorKeyword(std::string_view word) {
  for (std::string_view k : {"not", "and", "or", "if", "else", "lambda", "in", "is"}) {
    if (word == k) return true;
  }
  return false;
}

}  // namespace

Status CheckScriptSource(std::string_view s, const std::string& file, const std::string& record) {
  const size_t n = s.size();
  size_t line = 1;
  size_t brackets = 0;  // open now
  size_t tokens = 0;    // in the current logical line
  std::vector<size_t> indents = {0};
  bool line_start = true;
  auto refuse = [&](const std::string& what, size_t value, size_t limit) {
    return InvalidArgument(StrCat(file, ": ", record, " line ", line, ": ", what, " (", value,
                                  "; at most ", limit,
                                  "): refused before TorchScript's compiler reads it, which "
                                  "recurses once per level (Note [Script source limits])"));
  };
  size_t i = 0;
  while (i < n) {
    if (line_start) {
      line_start = false;
      size_t width = 0;
      while (i < n && (s[i] == ' ' || s[i] == '\t')) ++width, ++i;
      if (i < n && s[i] != '\n' && s[i] != '\r' && s[i] != '#') {  // not blank nor a comment
        while (width < indents.back()) indents.pop_back();
        if (width > indents.back()) {
          indents.push_back(width);
          if (indents.size() - 1 > kMaxBlockDepth) {
            return refuse("blocks nest too deep", indents.size() - 1, kMaxBlockDepth);
          }
        }
      }
      continue;
    }
    const char c = s[i];
    if (c == '\n') {
      ++line, ++i;
      if (brackets == 0) tokens = 0, line_start = true;
      continue;
    }
    if (c == '\\') {  // a line continuation, or a stray backslash the parser refuses
      if (i + 1 < n && s[i + 1] == '\n') ++line;
      i += 2;
      continue;
    }
    if (c == '#') {
      while (i < n && s[i] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {
      const bool triple = i + 2 < n && s[i + 1] == c && s[i + 2] == c;
      i += triple ? 3 : 1;
      while (i < n) {
        if (s[i] == '\\') {
          if (i + 1 < n && s[i + 1] == '\n') ++line;
          i += 2;
        } else if (s[i] == '\n') {
          if (!triple) break;  // unterminated: the parser refuses it
          ++line, ++i;
        } else if (s[i] == c && (!triple || (i + 2 < n && s[i + 1] == c && s[i + 2] == c))) {
          i += triple ? 3 : 1;
          break;
        } else {
          ++i;
        }
      }
      continue;
    }
    if (IsIdentifierStart(c)) {
      const size_t begin = i;
      while (i < n && IsIdentifierChar(s[i])) ++i;
      if (IsOperatorKeyword(s.substr(begin, i - begin))) ++tokens;
    } else if (IsDigit(c)) {
      while (i < n && (IsIdentifierChar(s[i]) || s[i] == '.')) ++i;  // 1, 0x1f, 1.5e3
    } else {
      if (c == '(' || c == '[' || c == '{') {
        ++tokens;
        if (++brackets > kMaxBracketDepth) {
          return refuse("brackets nest too deep", brackets, kMaxBracketDepth);
        }
      } else if (c == ')' || c == ']' || c == '}') {
        if (brackets > 0) --brackets;
      } else if (IsOperator(c)) {
        ++tokens;
      }
      ++i;
    }
    if (tokens > kMaxExpressionTokens) {
      return refuse("an expression of too many operators, attributes and brackets", tokens,
                    kMaxExpressionTokens);
    }
  }
  return Status::Ok();
}

}  // namespace qpool
