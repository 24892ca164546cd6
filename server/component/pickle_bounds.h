// Bounds on the pickles of a component file, checked before LibTorch's unpickler reads them.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace qpool {

// Note [Pickle bounds]
// LibTorch's unpickler allocates what a length field claims before it reads the bytes: a small
// data.pkl claiming a string of gigabytes cost that much before it failed. So each pickle record
// the load reads (data.pkl, constants.pkl) is walked first, opcode by opcode, in one pass that
// allocates nothing: every length (of strings, bytes, big integers, frames) must fit in what is
// left of the record, and an opcode outside the pickle protocols (0 to 5) ends the walk with an
// error. What the walk accepts, the unpickler may still refuse; it can no longer make it
// allocate more than the record holds.

// Ok if every length in the pickle `data` (the record `record` of the component file `file`)
// fits in the record; InvalidArgument naming the file, record and byte offset otherwise.
Status CheckPickleBounds(std::string_view data, const std::string& file,
                         const std::string& record);

}  // namespace qpool
