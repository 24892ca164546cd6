#include "bench_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "bench_html.h"
#include "output.h"

namespace qpool::cli {
namespace {

using nlohmann::json;

// Seconds in the CSV files: microsecond resolution is plenty for latencies of a server.
std::string Seconds(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6f", s);
  return buffer;
}

json DistributionJson(const Distribution& d) {
  if (d.count == 0) return nullptr;
  return {{"count", d.count}, {"min", d.min}, {"mean", d.mean}, {"p50", d.p50},
          {"p90", d.p90},     {"p99", d.p99}, {"max", d.max}};
}

template <typename Map>
// A map as a JSON object (numeric keys as strings).
json MapJson(const Map& map) {
  json out = json::object();
  for (const auto& [key, value] : map) {
    if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
      out[key] = value;
    } else {
      out[std::to_string(key)] = value;
    }
  }
  return out;
}

bool WriteText(const std::filesystem::path& path, const std::string& text, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    *error = "cannot write " + path.string();
    return false;
  }
  return true;
}

std::string Ms(double seconds) { return FormatFixed(seconds * 1000, 1); }

template <typename Map>
std::string Counts(const Map& counts) {
  std::string text;
  for (const auto& [key, count] : counts) {
    text += (text.empty() ? "" : "  ") + (key.empty() ? std::string("(none)") : key) + " " +
            std::to_string(count);
  }
  return text.empty() ? "-" : text;
}

std::vector<std::string> Row(const std::string& name, size_t requests, size_t ok, double window_s,
                             const Distribution& latency) {
  std::vector<std::string> row = {name, std::to_string(requests), std::to_string(ok),
                                  std::to_string(requests - ok),
                                  window_s > 0 ? FormatFixed(ok / window_s, 2) : "-"};
  for (double v : {latency.p50, latency.p90, latency.p99, latency.max}) {
    row.push_back(latency.count > 0 ? Ms(v) : "-");
  }
  return row;
}

}  // namespace

std::string SummaryText(const BenchResults& results) {
  const Summary& s = results.summary;
  std::ostringstream os;
  os << "qpool bench " << results.info.label << ": " << results.info.target << ", "
     << results.info.mode << "\n"
     << s.requests << " requests in " << FormatFixed(s.window_s, 2) << " s";
  if (s.warmup_requests > 0) {
    os << " after " << s.warmup_requests << " warm-up (" << Counts(s.warmup_codes) << ")";
  }
  os << "\n\n";
  Table table({"", "REQUESTS", "OK", "ERRORS", "REQ/S", "P50 MS", "P90 MS", "P99 MS", "MAX MS"});
  table.AddRow(Row("all", s.requests, s.ok, s.window_s, s.latency));
  if (s.templates.size() > 1) {
    for (const auto& [name, t] : s.templates) {
      table.AddRow(Row(name, t.requests, t.ok, s.window_s, t.latency));
    }
  }
  os << table.ToString() << "\n";
  auto line = [&os](const std::string& key, const std::string& value) {
    os << key << std::string(key.size() < 16 ? 16 - key.size() : 1, ' ') << value << "\n";
  };
  line("throughput", FormatFixed(s.throughput_rps, 3) + " req/s, " +
                         FormatFixed(s.images_per_s, 3) + " images/s");
  if (s.first_progress.count > 0) {
    line("first progress",
         "p50 " + Ms(s.first_progress.p50) + " ms  p99 " + Ms(s.first_progress.p99) + " ms");
  }
  if (s.queue.count > 0) {
    line("server queue", "p50 " + Ms(s.queue.p50) + " ms  p99 " + Ms(s.queue.p99) + " ms");
  }
  if (s.send_lag.count > 0 && s.send_lag.max >= 0.001) {
    line("send lag", "p99 " + Ms(s.send_lag.p99) + " ms  max " + Ms(s.send_lag.max) +
                         " ms (sent after due; latency includes it)");
  }
  line("status codes", Counts(s.codes));
  line("devices", Counts(s.devices));
  line("pods", Counts(s.peers) + (s.unanswered > 0 ? "  (no answer) " + std::to_string(s.unanswered)
                                                   : std::string()));
  size_t samples = 0;
  size_t events = 0;
  for (const MemoryPoint& m : results.memory) (m.is_sample() ? samples : events) += 1;
  std::string memory = std::to_string(samples) + " samples, " + std::to_string(events) + " events";
  for (const MemorySeriesSummary& m : SummarizeMemory(results.memory)) {
    memory += "; " + m.device + " peak allocated " + FormatBytes(m.peak_allocated_bytes) +
              ", reserved " + FormatBytes(m.peak_reserved_bytes);
  }
  line("memory", memory);
  for (const auto& [code, message] : s.error_examples) {
    std::string one_line = message.empty() ? "(no message)" : message;
    std::replace_if(
        one_line.begin(), one_line.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
    line(code, one_line);
  }
  for (const std::string& w : results.info.warnings) os << "warning: " << w << "\n";
  return os.str();
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void WriteRequestsCsv(std::ostream& out, const std::vector<RequestRecord>& records) {
  out << "index,warmup,template,pipeline,scheduled_s,start_s,end_s,latency_s,first_progress_s,"
         "status,device,peer,route,batch_size,images,queue_s,server_total_s,error\n";
  for (const RequestRecord& r : records) {
    out << r.index << "," << (r.warmup ? 1 : 0) << "," << CsvField(r.template_name) << ","
        << CsvField(r.pipeline) << "," << Seconds(r.scheduled_s) << "," << Seconds(r.start_s) << ","
        << Seconds(r.end_s) << "," << Seconds(r.latency_s()) << ","
        << (r.first_progress_s < 0 ? "" : Seconds(r.first_progress_latency_s())) << ","
        << CsvField(r.code) << "," << CsvField(r.device) << "," << CsvField(r.peer) << ","
        << CsvField(r.route) << "," << r.batch_size << "," << r.images << "," << Seconds(r.queue_s)
        << "," << Seconds(r.server_total_s) << "," << CsvField(r.error) << "\n";
  }
}

void WriteMemoryCsv(std::ostream& out, const std::vector<MemoryPoint>& memory) {
  out << "time_s,peer,device,kind,allocated_bytes,reserved_bytes,total_bytes,pipeline,detail\n";
  for (const MemoryPoint& m : memory) {
    out << Seconds(m.time_s) << "," << CsvField(m.peer) << "," << CsvField(m.device) << ","
        << CsvField(m.kind) << "," << m.allocated_bytes << "," << m.reserved_bytes << ","
        << m.total_bytes << "," << CsvField(m.pipeline) << "," << CsvField(m.detail) << "\n";
  }
}

std::vector<MemorySeriesSummary> SummarizeMemory(const std::vector<MemoryPoint>& memory) {
  std::map<std::pair<std::string, std::string>, MemorySeriesSummary> series;
  for (const MemoryPoint& m : memory) {
    if (!m.is_sample()) continue;
    MemorySeriesSummary& s = series[{m.peer, m.device}];
    s.peer = m.peer;
    s.device = m.device;
    ++s.samples;
    s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, m.allocated_bytes);
    s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, m.reserved_bytes);
    s.last_allocated_bytes = m.allocated_bytes;
    s.last_reserved_bytes = m.reserved_bytes;
    s.total_bytes = m.total_bytes;
  }
  std::vector<MemorySeriesSummary> out;
  for (auto& [key, s] : series) out.push_back(std::move(s));
  return out;
}

json SummaryJson(const BenchResults& results) {
  const Summary& s = results.summary;
  json templates = json::object();
  for (const auto& [name, t] : s.templates) {
    templates[name] = {
        {"requests", t.requests}, {"ok", t.ok}, {"latency_seconds", DistributionJson(t.latency)}};
  }
  json series = json::array();
  size_t samples = 0;
  std::map<std::string, size_t> event_kinds;
  for (const MemoryPoint& m : results.memory) {
    if (m.is_sample()) {
      ++samples;
    } else {
      ++event_kinds[m.kind];
    }
  }
  for (const MemorySeriesSummary& m : SummarizeMemory(results.memory)) {
    series.push_back({{"peer", m.peer},
                      {"device", m.device},
                      {"samples", m.samples},
                      {"peak_allocated_bytes", m.peak_allocated_bytes},
                      {"peak_reserved_bytes", m.peak_reserved_bytes},
                      {"last_allocated_bytes", m.last_allocated_bytes},
                      {"last_reserved_bytes", m.last_reserved_bytes},
                      {"total_bytes", m.total_bytes}});
  }
  size_t events = 0;
  for (const auto& [kind, count] : event_kinds) events += count;
  return {
      {"label", results.info.label},
      {"target", results.info.target},
      {"started_at", results.info.started_at},
      {"mode", results.info.mode},
      {"options", results.info.options},
      {"requests", s.requests},
      {"ok", s.ok},
      {"errors", s.requests - s.ok},
      {"images", s.images},
      {"warmup_requests", s.warmup_requests},
      {"window_seconds", s.window_s},
      {"throughput_rps", s.throughput_rps},
      {"throughput_images_per_second", s.images_per_s},
      {"latency_seconds", DistributionJson(s.latency)},
      {"first_progress_seconds", DistributionJson(s.first_progress)},
      {"queue_seconds", DistributionJson(s.queue)},
      {"send_lag_seconds", DistributionJson(s.send_lag)},
      {"codes", MapJson(s.codes)},
      {"warmup_codes", MapJson(s.warmup_codes)},
      {"error_examples", MapJson(s.error_examples)},
      {"devices", MapJson(s.devices)},
      {"peers", MapJson(s.peers)},
      {"unanswered", s.unanswered},
      {"routes", MapJson(s.routes)},
      {"batch_sizes", MapJson(s.batch_sizes)},
      {"templates", templates},
      {"memory",
       {{"samples", samples},
        {"events", events},
        {"event_kinds", MapJson(event_kinds)},
        {"series", series}}},
      {"warnings", results.info.warnings},
      {"files",
       {{"summary", "summary.json"},
        {"requests", "requests.csv"},
        {"memory", "memory.csv"},
        {"report", "report.html"}}},
  };
}

bool WriteReport(const std::string& dir, const BenchResults& results, std::string* error) {
  const std::filesystem::path root(dir);
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec || !std::filesystem::is_directory(root)) {
    *error = "cannot create the directory " + dir + (ec ? ": " + ec.message() : std::string());
    return false;
  }
  std::ostringstream requests;
  WriteRequestsCsv(requests, results.records);
  std::ostringstream memory;
  WriteMemoryCsv(memory, results.memory);
  return WriteText(root / "summary.json",
                   SummaryJson(results).dump(2, ' ', false, json::error_handler_t::replace) + "\n",
                   error) &&
         WriteText(root / "requests.csv", requests.str(), error) &&
         WriteText(root / "memory.csv", memory.str(), error) &&
         WriteText(root / "report.html", RenderHtml(results), error);
}

}  // namespace qpool::cli
