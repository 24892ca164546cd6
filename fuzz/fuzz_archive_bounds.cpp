// fuzz_archive_bounds: arbitrary bytes as a component file's TorchScript source
// (CheckScriptSource, Note [Script source limits]) and as one of its pickles (CheckPickleBounds,
// Note [Pickle bounds]): the linear scans that run before LibTorch's compiler and unpickler. A
// refusal must be INVALID_ARGUMENT naming the file and the record; an accepted pickle has its
// STOP opcode.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "component/pickle_bounds.h"
#include "component/script_source_limits.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string file = "/models/m/unet.pt";
  const Status source = CheckScriptSource(input, file, "code/__torch__.py");
  if (!source.ok()) {
    FUZZ_CHECK(source.code() == StatusCode::kInvalidArgument, source.ToString());
    FUZZ_CHECK(fuzz::StartsWith(source.message(), file + ": code/__torch__.py line "),
               source.message());
  }
  const Status pickle = CheckPickleBounds(input, file, "data.pkl");
  if (!pickle.ok()) {
    FUZZ_CHECK(pickle.code() == StatusCode::kInvalidArgument, pickle.ToString());
    FUZZ_CHECK(fuzz::StartsWith(pickle.message(), file + ": data.pkl byte "), pickle.message());
  } else {
    FUZZ_CHECK(input.find('.') != std::string_view::npos, "a pickle without STOP accepted");
  }
  return 0;
}
