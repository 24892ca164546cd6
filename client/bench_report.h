// The files of `qpool bench --out DIR`: summary.json, requests.csv, memory.csv and report.html
// (bench_html.h). Pure functions of the run's results, plus WriteReport for the directory.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "bench_record.h"
#include "bench_stats.h"

namespace qpool::cli {

// How the run was set up, for the report's header and summary.json.
struct RunInfo {
  std::string label;                  // --label, the report's title
  std::string target;                 // the server address (--server)
  std::string started_at;             // UTC, ISO 8601
  std::string mode;                   // human text: "closed loop, concurrency 8", ...
  nlohmann::json options;             // the run's settings and mix, echoed into summary.json
  std::vector<std::string> warnings;  // e.g. a memory RPC the server refused
};

// Everything one run produced.
struct BenchResults {
  RunInfo info;
  std::vector<RequestRecord> records;  // every request, warm-up included
  std::vector<MemoryPoint> memory;     // samples and events, in time order
  Summary summary;                     // Summarize(records)
};

// One CSV field (RFC 4180): quoted when it holds a comma, quote, CR or LF, with quotes doubled.
std::string CsvField(const std::string& text);

// requests.csv: a header, then one row per record.
void WriteRequestsCsv(std::ostream& out, const std::vector<RequestRecord>& records);
// memory.csv: a header, then one row per sample or event.
void WriteMemoryCsv(std::ostream& out, const std::vector<MemoryPoint>& memory);

// The per-(pod, device) memory series of a run: samples and peaks.
struct MemorySeriesSummary {
  std::string peer;
  std::string device;
  size_t samples = 0;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t last_allocated_bytes = 0;
  uint64_t last_reserved_bytes = 0;
  uint64_t total_bytes = 0;
};
std::vector<MemorySeriesSummary> SummarizeMemory(const std::vector<MemoryPoint>& memory);

// The summary printed on stdout: the run, a table of throughput and latency (one row per mix
// entry when there are several), then counts by status code, device and pod, and memory peaks.
std::string SummaryText(const BenchResults& results);

// summary.json's document.
nlohmann::json SummaryJson(const BenchResults& results);

// Writes the four files into `dir`, creating it (and its parents) if needed. On failure returns
// false with `error` naming the path.
bool WriteReport(const std::string& dir, const BenchResults& results, std::string* error);

}  // namespace qpool::cli
