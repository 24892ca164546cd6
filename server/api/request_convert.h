// The request messages' conversion to engine types, kept free of LibTorch so that the fuzz
// targets (fuzz/) compile the very code the server runs.
#pragma once

#include "pipeline/generate_request.h"
#include "qpool/v1/qpool.pb.h"

namespace qpool::api {

// Field by field; an optional field the client did not set stays absent.
GenerateRequestIn FromProto(const v1::GenerateRequest& request);

}  // namespace qpool::api
