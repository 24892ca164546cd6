// The OpenAI images API's JSON at the HTTP edge: a request body into the engine's GenerateCall,
// a GenerateReply or a Status into the response body and HTTP code. Pure functions (no I/O);
// tests/integration/test_http_api.py holds the edge to them against a real server.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pool/pipeline_status.h"
#include "pool/pool_request.h"
#include "util/status.h"

namespace qpool::api::http {

// Note [OpenAI images edge]
// POST /v1/images/generations takes OpenAI's request body: `model` (the pipeline), `prompt`, `n`
// (num_images, within the manifest's limits as over gRPC), `size` ("WIDTHxHEIGHT", or "auto" for
// the pipeline's default), `response_format` ("b64_json"; "url" is refused: an image URL would be
// served only by the replica that made it, which breaks behind a balancer), `output_format`
// ("png"), `stream` (Note [Image events]), `user` (accepted, unused), and qpool's own fields in the
// same body, named as in GenerateRequest: negative_prompt, steps, guidance_scale, seed, scheduler,
// true_cfg_scale and the size conditioning (original_width, ...). The edge is as strict as the
// protobuf one: an unknown field, a value of the wrong JSON type or out of its type's range is
// INVALID_ARGUMENT naming the field, never ignored, so a typo ("step") cannot silently change an
// image. The reply is OpenAI's ({created, data: [{b64_json}]}) plus a `qpool` object with what
// GenerateResult carries (seed, device, scheduler, steps, guidance_scale, timings, ...), so that a
// client can reproduce an image through either API: the same request and seed give the same PNG
// bytes. Errors are OpenAI error objects ({"error": {message, type, code}}), with the HTTP code
// mapped from the engine's Status (HttpCodeOf) and the gRPC code's name as `code`.
struct ImagesRequest {
  GenerateCall call;
  bool stream = false;  // `stream: true`: progress and images as server-sent events
};
StatusOr<ImagesRequest> ParseImagesRequest(std::string_view body);

// The response body for `reply`; `created` is the Unix time the reply is stamped with.
std::string ImagesResponseJson(GenerateReply reply, int64_t created);

// Note [Image events]
// With `stream: true` the reply is a text/event-stream (server-sent events, 200 once the
// generation is under way; a request refused before that gets its error code as without
// `stream`): an `event: progress` per denoising step ({type: "progress", step, total,
// elapsed_seconds}), then an `event: image_generation.completed` per image as OpenAI's streaming
// images API names it ({type, index, b64_json, created_at, size, output_format, qpool}), or one
// `event: error` ({type: "error", error: {message, type, code}}) if the generation fails after
// the stream began; the stream then ends.
std::string ProgressEvent(int step, int total, double elapsed_seconds);
std::string CompletedEvents(GenerateReply reply, int64_t created);
std::string ErrorEvent(const Status& status);

// GET /v1/models: OpenAI's model list ({object: "list", data: [{id, object: "model", created,
// owned_by: "qpool"}]}), each entry with qpool's kind, state and device beside OpenAI's fields.
std::string ModelsJson(const std::vector<PipelineStatus>& pipelines, int64_t created);

// The HTTP code of an engine status: INVALID_ARGUMENT 400, UNAUTHENTICATED 401,
// PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS and FAILED_PRECONDITION 409,
// RESOURCE_EXHAUSTED 429 (a full queue: retry later), CANCELLED 499 (the client closed the
// request), INTERNAL 500, UNAVAILABLE 503 (draining, no device), DEADLINE_EXCEEDED 504.
int HttpCodeOf(StatusCode code);

// The OpenAI error object for `status` (not Ok).
std::string ErrorJson(const Status& status);

// Standard base64 (RFC 4648, with padding).
std::string Base64(std::string_view bytes);

}  // namespace qpool::api::http
