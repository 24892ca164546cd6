#include "bench_html.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "bench_svg.h"
#include "output.h"

namespace qpool::cli {
namespace {

constexpr int kChartWidth = 1040;
constexpr int kChartHeight = 300;
// Past these, the scatter shows every n-th request and drops the per-point hover text, so
// that a long run still gives a page a browser opens quickly.
constexpr size_t kMaxScatterPoints = 20000;
constexpr size_t kMaxTitledPoints = 5000;
constexpr size_t kMaxEventRows = 100;

constexpr const char* kOkColor = "#2563eb";
constexpr const char* kP50Color = "#0f766e";
constexpr const char* kP99Color = "#b45309";
const char* const kErrorColors[] = {"#dc2626", "#f97316", "#9333ea",
                                    "#db2777", "#92400e", "#6b7280"};
const char* const kDeviceColors[] = {"#2563eb", "#16a34a", "#9333ea", "#ea580c",
                                     "#0891b2", "#be123c", "#4d7c0f", "#6b7280"};

constexpr const char* kStyle = R"(
body{margin:0;background:#f3f5f8;color:#1f2937;
 font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1100px;margin:0 auto;padding:20px 24px 32px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:15px;margin:2px 0 10px}
.meta{color:#4b5563;font-size:13px;line-height:1.6}
.cards{display:grid;grid-template-columns:repeat(6,1fr);gap:10px;margin:16px 0 6px}
.card{background:#fff;border:1px solid #e2e6ec;border-radius:8px;padding:10px 12px}
.card .v{font-size:21px;font-weight:650;white-space:nowrap}
.card .k{font-size:12px;color:#6b7280;margin-top:2px}
.card.bad .v{color:#dc2626}
section{background:#fff;border:1px solid #e2e6ec;border-radius:8px;padding:12px 16px;margin:12px 0}
table{border-collapse:collapse;font-size:13px;margin:4px 0}
th,td{padding:4px 12px;text-align:right;border-bottom:1px solid #edf0f3;white-space:nowrap}
th{color:#4b5563;font-weight:600;background:#f8fafc}
th:first-child,td:first-child{text-align:left}
td.msg,th.msg{text-align:left;white-space:normal;max-width:520px}
td.msg{color:#4b5563}
.cols{display:flex;gap:36px;flex-wrap:wrap;align-items:flex-start}
.note{color:#6b7280;font-size:12px;margin:6px 0 0}
.warn{color:#b45309}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
svg.chart{display:block;margin:0 0 4px}
svg text{font-size:12px}
svg .title{font-size:13px;font-weight:600;fill:#111827}
svg .tick{fill:#4b5563}
svg .label{fill:#374151}
svg .grid line{stroke:#edf0f3}
svg .axis line{stroke:#9ca3af}
svg .band{fill:#64748b;font-size:11px}
svg .empty{fill:#9ca3af;font-size:14px}
svg .ref{font-size:11px;font-weight:600}
)";

std::string Esc(const std::string& text) { return XmlEscape(text); }

std::string Ms(double seconds) { return FormatFixed(seconds * 1000, 1); }

std::string Percent(size_t part, size_t whole) {
  return whole == 0 ? "-" : FormatFixed(100.0 * static_cast<double>(part) / whole, 1) + "%";
}

// The unit the VRAM plot shows bytes in, from the largest value.
std::pair<double, std::string> ByteUnit(uint64_t max_bytes) {
  if (max_bytes >= (2ull << 30)) return {1024.0 * 1024 * 1024, "GiB"};
  if (max_bytes >= (2ull << 20)) return {1024.0 * 1024, "MiB"};
  return {1024.0, "KiB"};
}

// Where the run's charts share their x axis: the end of the warm-up (the first measured
// request's due time, or the last warm-up request's end when nothing was measured; < 0 without
// a warm-up) and the last time anything happened.
struct Timeline {
  double warmup_end = -1;
  double end = 0;
};

Timeline RunTimeline(const BenchResults& results) {
  Timeline t;
  double warmup_last = -1;
  double first_measured = -1;
  for (const RequestRecord& r : results.records) {
    t.end = std::max(t.end, r.end_s);
    if (r.warmup) {
      warmup_last = std::max(warmup_last, r.end_s);
    } else if (first_measured < 0 || r.scheduled_s < first_measured) {
      first_measured = r.scheduled_s;
    }
  }
  for (const MemoryPoint& m : results.memory) t.end = std::max(t.end, m.time_s);
  if (warmup_last >= 0) t.warmup_end = first_measured >= 0 ? first_measured : warmup_last;
  return t;
}

// The warm-up band and the shared x range.
void AddTimeline(Plot& plot, const Timeline& timeline) {
  if (timeline.warmup_end > 0) plot.bands.push_back({0, timeline.warmup_end, "warm-up"});
  plot.x_end = timeline.end;
}

Plot LatencyPlot(const BenchResults& results, const Timeline& timeline) {
  const std::vector<RequestRecord>& records = results.records;
  double max_latency = 0;
  std::set<std::string> codes;
  for (const RequestRecord& r : records) {
    max_latency = std::max(max_latency, r.latency_s());
    codes.insert(r.code);
  }
  Plot plot;
  plot.title = "Latency per request, by the time it was due";
  plot.x_label = "time since start (s)";
  const bool in_ms = max_latency < 2;
  plot.y_scale = in_ms ? 1e-3 : 1;
  plot.y_label = in_ms ? "latency (ms)" : "latency (s)";
  const size_t stride = records.size() / kMaxScatterPoints + 1;
  const bool titled = records.size() / stride <= kMaxTitledPoints;
  // OK first, so that errors are drawn on top of it.
  std::vector<std::string> order = {"OK"};
  for (const std::string& code : codes) {
    if (code != "OK") order.push_back(code);
  }
  size_t error_index = 0;
  for (const std::string& code : order) {
    if (codes.count(code) == 0) continue;
    PlotSeries s;
    s.label = code;
    s.color = code == "OK" ? kOkColor : kErrorColors[std::min<size_t>(error_index++, 5)];
    for (size_t i = 0; i < records.size(); i += stride) {
      const RequestRecord& r = records[i];
      if (r.code != code) continue;
      s.points.push_back({r.scheduled_s, r.latency_s()});
      if (titled) {
        s.titles.push_back("#" + std::to_string(r.index) + " " + r.template_name + ": " + r.code +
                           " in " + Ms(r.latency_s()) + " ms" +
                           (r.device.empty() ? "" : " on " + r.device) +
                           (r.peer.empty() ? "" : " (" + r.peer + ")"));
      }
    }
    plot.series.push_back(std::move(s));
  }
  const Distribution& l = results.summary.latency;
  auto label = [in_ms](const char* name, double v) {
    return std::string(name) + " " + (in_ms ? Ms(v) + " ms" : FormatFixed(v, 2) + " s");
  };
  if (l.count > 0) {
    plot.lines.push_back({l.p50, label("p50", l.p50), kP50Color});
    plot.lines.push_back({l.p99, label("p99", l.p99), kP99Color});
  }
  AddTimeline(plot, timeline);
  plot.empty_text = "no requests";
  return plot;
}

Plot ThroughputPlot(const BenchResults& results, const Timeline& timeline) {
  double span = 0;
  for (const RequestRecord& r : results.records) span = std::max(span, r.end_s);
  const double bin = NiceBinWidth(span, 40);
  Plot plot;
  plot.title = "Throughput: requests finished per second (bins of " + FormatTick(bin, bin) + " s)";
  plot.x_label = "time since start (s)";
  plot.y_label = "requests / s";
  PlotSeries errors{"errors", kErrorColors[0], PlotSeries::Style::kBars, {}, {}, bin};
  PlotSeries ok{"OK", kOkColor, PlotSeries::Style::kBars, {}, {}, bin};
  for (const RateBin& b : ThroughputOverTime(results.records, bin)) {
    // Errors are drawn first at the height of both, then OK over them: a stacked bar.
    errors.points.push_back({b.start_s, b.ok_per_s + b.errors_per_s});
    ok.points.push_back({b.start_s, b.ok_per_s});
  }
  const bool any_error = results.summary.requests > results.summary.ok ||
                         std::any_of(results.records.begin(), results.records.end(),
                                     [](const RequestRecord& r) { return !r.ok(); });
  if (any_error) plot.series.push_back(std::move(errors));
  plot.series.push_back(std::move(ok));
  if (results.summary.throughput_rps > 0) {
    plot.lines.push_back({results.summary.throughput_rps,
                          "mean " + FormatFixed(results.summary.throughput_rps, 1) + "/s",
                          kP50Color});
  }
  AddTimeline(plot, timeline);
  plot.empty_text = "no requests";
  return plot;
}

Plot MemoryPlot(const BenchResults& results, const Timeline& timeline) {
  std::set<std::string> peers;
  uint64_t max_bytes = 0;
  std::map<std::pair<std::string, std::string>, std::pair<PlotSeries, PlotSeries>> series;
  for (const MemoryPoint& m : results.memory) {
    if (!m.is_sample()) continue;
    peers.insert(m.peer);
    max_bytes = std::max({max_bytes, m.allocated_bytes, m.reserved_bytes});
    auto& [allocated, reserved] = series[{m.device, m.peer}];
    allocated.points.push_back({m.time_s, static_cast<double>(m.allocated_bytes)});
    reserved.points.push_back({m.time_s, static_cast<double>(m.reserved_bytes)});
  }
  const auto [scale, unit] = ByteUnit(max_bytes);
  Plot plot;
  plot.title = "Device memory (samples; triangles mark memory events)";
  plot.x_label = "time since start (s)";
  plot.y_label = "memory (" + unit + ")";
  plot.y_scale = scale;
  size_t color = 0;
  for (auto& [key, pair] : series) {
    const std::string name = key.first + (peers.size() > 1 ? " @ " + key.second : "");
    const char* c = kDeviceColors[color++ % 8];
    pair.first.label = name + " allocated";
    pair.first.color = c;
    pair.first.style = PlotSeries::Style::kLine;
    pair.second.label = name + " reserved";
    pair.second.color = c;
    pair.second.style = PlotSeries::Style::kDashedLine;
    plot.series.push_back(std::move(pair.second));
    plot.series.push_back(std::move(pair.first));
  }
  for (const MemoryPoint& m : results.memory) {
    if (m.is_sample()) continue;
    plot.markers.push_back({m.time_s,
                            FormatFixed(m.time_s, 2) + " s: " + m.kind + " " + m.pipeline + " on " +
                                m.device + ", allocated " + FormatBytes(m.allocated_bytes) +
                                (m.detail.empty() ? "" : " (" + m.detail + ")"),
                            "#475569"});
  }
  AddTimeline(plot, timeline);
  plot.empty_text = "no memory samples";
  return plot;
}

void Card(std::ostringstream& os, const std::string& value, const std::string& key,
          bool bad = false) {
  os << "<div class='card" << (bad ? " bad" : "") << "'><div class='v'>" << Esc(value)
     << "</div><div class='k'>" << Esc(key) << "</div></div>";
}

void DistributionRow(std::ostringstream& os, const std::string& name, const Distribution& d) {
  os << "<tr><td>" << Esc(name) << "</td><td>" << d.count << "</td>";
  if (d.count == 0) {
    os << "<td colspan='6'>-</td></tr>";
    return;
  }
  for (double v : {d.min, d.mean, d.p50, d.p90, d.p99, d.max}) os << "<td>" << Ms(v) << "</td>";
  os << "</tr>";
}

void CountTable(std::ostringstream& os, const std::string& title, const std::string& column,
                const std::map<std::string, size_t>& counts, size_t whole) {
  os << "<div><h2>" << Esc(title) << "</h2><table><tr><th>" << Esc(column)
     << "</th><th>requests</th><th>share</th></tr>";
  for (const auto& [key, count] : counts) {
    os << "<tr><td>" << Esc(key.empty() ? "(none)" : key) << "</td><td>" << count << "</td><td>"
       << Percent(count, whole) << "</td></tr>";
  }
  if (counts.empty()) os << "<tr><td colspan='3'>none</td></tr>";
  os << "</table></div>";
}

void Header(std::ostringstream& os, const BenchResults& results) {
  const RunInfo& info = results.info;
  const Summary& s = results.summary;
  os << "<h1>qpool bench" << (info.label.empty() ? "" : ": " + Esc(info.label)) << "</h1>";
  os << "<div class='meta'>" << Esc(info.target) << " &middot; " << Esc(info.mode)
     << " &middot; started " << Esc(info.started_at) << " &middot; " << s.requests
     << " measured requests in " << FormatFixed(s.window_s, 2) << " s";
  if (s.warmup_requests > 0) os << " after " << s.warmup_requests << " warm-up requests";
  os << "</div><div class='cards'>";
  Card(os, FormatFixed(s.throughput_rps, 2) + " /s", "throughput (OK)");
  Card(os, FormatFixed(s.images_per_s, 2) + " /s", "images");
  Card(os, s.latency.count ? Ms(s.latency.p50) + " ms" : "-", "latency p50");
  Card(os, s.latency.count ? Ms(s.latency.p99) + " ms" : "-", "latency p99");
  Card(os, s.first_progress.count ? Ms(s.first_progress.p50) + " ms" : "-", "first progress p50");
  Card(os, std::to_string(s.requests - s.ok) + " / " + std::to_string(s.requests),
       "errors (" + Percent(s.requests - s.ok, s.requests) + ")", s.ok < s.requests);
  os << "</div>";
  for (const std::string& w : info.warnings) os << "<p class='note warn'>" << Esc(w) << "</p>";
}

void LatencySection(std::ostringstream& os, const BenchResults& results, const Timeline& timeline) {
  const Summary& s = results.summary;
  os << "<section>" << RenderSvg(LatencyPlot(results, timeline), kChartWidth, kChartHeight);
  os << "<table><tr><th>milliseconds</th><th>count</th><th>min</th><th>mean</th><th>p50</th>"
        "<th>p90</th><th>p99</th><th>max</th></tr>";
  DistributionRow(os, "latency (OK requests)", s.latency);
  DistributionRow(os, "time to first progress", s.first_progress);
  DistributionRow(os, "server queue time", s.queue);
  DistributionRow(os, "send lag (started - due)", s.send_lag);
  os << "</table><p class='note'>Latency runs from the time a request was due (open loop: its "
        "scheduled arrival), so a client falling behind shows as latency rather than hiding "
        "queueing. Percentiles interpolate linearly between ranks.</p></section>";
}

void MemorySection(std::ostringstream& os, const BenchResults& results, const Timeline& timeline) {
  os << "<section>" << RenderSvg(MemoryPlot(results, timeline), kChartWidth, kChartHeight);
  os << "<table><tr><th>device</th><th>pod</th><th>samples</th><th>peak allocated</th>"
        "<th>peak reserved</th><th>last allocated</th><th>capacity</th></tr>";
  const std::vector<MemorySeriesSummary> series = SummarizeMemory(results.memory);
  for (const MemorySeriesSummary& m : series) {
    os << "<tr><td>" << Esc(m.device) << "</td><td>" << Esc(m.peer) << "</td><td>" << m.samples
       << "</td><td>" << FormatBytes(m.peak_allocated_bytes) << "</td><td>"
       << FormatBytes(m.peak_reserved_bytes) << "</td><td>" << FormatBytes(m.last_allocated_bytes)
       << "</td><td>" << (m.total_bytes ? FormatBytes(m.total_bytes) : "-") << "</td></tr>";
  }
  if (series.empty()) os << "<tr><td colspan='7'>no samples</td></tr>";
  os << "</table>";
  std::vector<const MemoryPoint*> events;
  for (const MemoryPoint& m : results.memory) {
    if (!m.is_sample()) events.push_back(&m);
  }
  if (!events.empty()) {
    os << "<h2 style='margin-top:12px'>Memory events (" << events.size() << ")</h2><table><tr>"
       << "<th>time (s)</th><th>kind</th><th>pipeline</th><th>device</th><th>allocated after"
       << "</th><th>reserved after</th><th class='msg'>detail</th></tr>";
    for (size_t i = 0; i < events.size() && i < kMaxEventRows; ++i) {
      const MemoryPoint& m = *events[i];
      os << "<tr><td>" << FormatFixed(m.time_s, 3) << "</td><td>" << Esc(m.kind) << "</td><td>"
         << Esc(m.pipeline) << "</td><td>" << Esc(m.device) << "</td><td>"
         << FormatBytes(m.allocated_bytes) << "</td><td>" << FormatBytes(m.reserved_bytes)
         << "</td><td class='msg'>" << Esc(m.detail) << "</td></tr>";
    }
    os << "</table>";
    if (events.size() > kMaxEventRows) {
      os << "<p class='note'>First " << kMaxEventRows << " shown; memory.csv has all.</p>";
    }
  }
  os << "</section>";
}

void OutcomeSection(std::ostringstream& os, const BenchResults& results) {
  const Summary& s = results.summary;
  os << "<section><h2>Status codes</h2><table><tr><th>code</th><th>requests</th><th>share</th>"
        "<th>warm-up</th><th class='msg'>first message</th></tr>";
  std::set<std::string> codes;
  for (const auto& [code, n] : s.codes) codes.insert(code);
  for (const auto& [code, n] : s.warmup_codes) codes.insert(code);
  size_t error_index = 0;
  for (const std::string& code : codes) {
    const auto count = s.codes.count(code) ? s.codes.at(code) : 0;
    const auto warmup = s.warmup_codes.count(code) ? s.warmup_codes.at(code) : 0;
    const char* color = code == "OK" ? kOkColor : kErrorColors[std::min<size_t>(error_index++, 5)];
    os << "<tr><td><span class='swatch' style='background:" << color << "'></span>" << Esc(code)
       << "</td><td>" << count << "</td><td>" << Percent(count, s.requests) << "</td><td>" << warmup
       << "</td><td class='msg'>"
       << Esc(s.error_examples.count(code) ? s.error_examples.at(code) : "") << "</td></tr>";
  }
  os << "</table></section><section class='cols'>";
  CountTable(os, "OK requests by device", "device", s.devices, s.ok);
  std::map<std::string, size_t> peers = s.peers;
  if (s.unanswered > 0) peers["(no answer)"] = s.unanswered;
  CountTable(os, "Requests by pod (peer)", "peer", peers, s.requests);
  os << "<div><h2>Request mix</h2><table><tr><th>entry</th><th>requests</th><th>OK</th>"
        "<th>p50 ms</th><th>p99 ms</th></tr>";
  for (const auto& [name, t] : s.templates) {
    os << "<tr><td>" << Esc(name) << "</td><td>" << t.requests << "</td><td>" << t.ok << "</td><td>"
       << (t.latency.count ? Ms(t.latency.p50) : "-") << "</td><td>"
       << (t.latency.count ? Ms(t.latency.p99) : "-") << "</td></tr>";
  }
  os << "</table></div></section>";
}

}  // namespace

std::string RenderHtml(const BenchResults& results) {
  const Timeline timeline = RunTimeline(results);
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
     << "<meta name='viewport' content='width=device-width, initial-scale=1'>"
     << "<title>qpool bench" << (results.info.label.empty() ? "" : ": " + Esc(results.info.label))
     << "</title><style>" << kStyle << "</style></head><body><main>";
  Header(os, results);
  LatencySection(os, results, timeline);
  os << "<section>" << RenderSvg(ThroughputPlot(results, timeline), kChartWidth, kChartHeight)
     << "</section>";
  MemorySection(os, results, timeline);
  OutcomeSection(os, results);
  os << "<p class='note'>Files next to this page: summary.json, requests.csv (one row per "
        "request), memory.csv (samples and events).</p></main></body></html>\n";
  return os.str();
}

}  // namespace qpool::cli
