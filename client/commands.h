// The `qpool` commands. Each runs one command against a connected server, prints its result
// (human text, or one JSON document with --json) and returns the process exit code (ExitCode).
// A malformed flag value throws UsageError before any RPC is made.
#pragma once

#include "cli_args.h"
#include "connection.h"

namespace qpool::cli {

// generate: streams InferenceService/Generate, draws progress, writes the PNG files.
int RunGenerate(const ParsedArgs& args, const Connection& connection);
// encode: InferenceService/Encode; prints shape, dtype and statistics; --out writes raw bytes.
int RunEncode(const ParsedArgs& args, const Connection& connection);
// list: ModelService/ListPipelines as a table.
int RunList(const ParsedArgs& args, const Connection& connection);
// load NAME [--device D]: ModelService/LoadPipeline.
int RunLoad(const ParsedArgs& args, const Connection& connection);
// unload NAME: ModelService/UnloadPipeline.
int RunUnload(const ParsedArgs& args, const Connection& connection);
// offload NAME, onload NAME [--device D], move NAME --device D: ModelService/OffloadPipeline,
// OnloadPipeline and MovePipeline; print what moved (component, from, to, bytes, time).
int RunOffload(const ParsedArgs& args, const Connection& connection);
int RunOnload(const ParsedArgs& args, const Connection& connection);
int RunMove(const ParsedArgs& args, const Connection& connection);
// policy NAME POLICY [--idle-seconds S]: ModelService/SetOffloadPolicy.
int RunPolicy(const ParsedArgs& args, const Connection& connection);
// empty-cache [--device D]: ModelService/EmptyCache; prints the bytes released.
int RunEmptyCache(const ParsedArgs& args, const Connection& connection);
// memory: ModelService/GetMemoryReport as device and component tables.
// snapshot --out FILE: ModelService/GetAllocatorSnapshot, written to FILE.
int RunSnapshot(const ParsedArgs& args, const Connection& connection);
// watch [--after SEQ] [--count N]: ModelService/WatchMemory, one line (or, with --json, one JSON
// object) per event as it arrives.
int RunWatch(const ParsedArgs& args, const Connection& connection);
int RunMemory(const ParsedArgs& args, const Connection& connection);
// health [--service NAME]: grpc.health.v1.Health/Check; exit 0 only when SERVING.
int RunHealth(const ParsedArgs& args, const Connection& connection);
// bench: a load test (bench_command.cpp); exit 0 when at least one measured request succeeded.
int RunBench(const ParsedArgs& args, const Connection& connection);
// bench's checks of its flags and mix file, made before connecting; throws UsageError.
void CheckBench(const ParsedArgs& args);

// Required flag: its value, or throws UsageError naming it.
std::string RequiredFlag(const ParsedArgs& args, const std::string& flag);

}  // namespace qpool::cli
