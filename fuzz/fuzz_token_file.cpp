// fuzz_token_file: arbitrary text as a bearer-token file through ParseTokens (Note [Bearer
// tokens] in util/token_file.h). An error must be INVALID_ARGUMENT naming the file; every token
// accepted must be 16 to 4096 printable ASCII characters without spaces.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "util/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  const std::string path = "/run/secrets/qpool/admin-tokens";
  const std::string text(reinterpret_cast<const char*>(data), size);
  const StatusOr<std::vector<std::string>> tokens = ParseTokens(text, path);
  if (!tokens.ok()) {
    FUZZ_CHECK(tokens.status().code() == StatusCode::kInvalidArgument, tokens.status().ToString());
    FUZZ_CHECK(fuzz::StartsWith(tokens.status().message(), path), "error does not name the file");
    return 0;
  }
  FUZZ_CHECK(!tokens->empty(), "a token file without tokens accepted");
  for (const std::string& token : *tokens) {
    FUZZ_CHECK(token.size() >= 16 && token.size() <= 4096, "token length");
    FUZZ_CHECK(token[0] != '#', "a comment accepted as a token");
    for (char c : token) FUZZ_CHECK(c > 0x20 && c < 0x7f, "a token character");
    FUZZ_CHECK(text.find(token) != std::string::npos, "a token not in the file");
  }
  return 0;
}
