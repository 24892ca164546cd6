// The files of `qpool bench --out`: CSV quoting, charts of empty and one-point data, a report
// page with nothing external, and summary.json's numbers.
#include "bench_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_html.h"
#include "bench_svg.h"
#include "testing/test_paths.h"

namespace qpool::cli {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

RequestRecord Record(uint64_t index, const std::string& code, double scheduled, double end) {
  RequestRecord r;
  r.index = index;
  r.template_name = "tiny";
  r.pipeline = "tiny";
  r.scheduled_s = scheduled;
  r.start_s = scheduled;
  r.end_s = end;
  r.code = code;
  if (code == "OK") {
    r.device = "cpu";
    r.images = 1;
    r.first_progress_s = scheduled + (end - scheduled) / 2;
  } else {
    r.error = "no pipeline named 'x, \"y\"'\nin the repository";
  }
  r.peer = "ipv4:127.0.0.1:50051";
  return r;
}

BenchResults Results(std::vector<RequestRecord> records, std::vector<MemoryPoint> memory) {
  BenchResults results;
  results.info.label = "tiny <test>";
  results.info.target = "127.0.0.1:50051";
  results.info.started_at = "2026-01-01T00:00:00Z";
  results.info.mode = "closed loop, concurrency 2";
  results.info.options = {{"loop", "closed"}};
  results.records = std::move(records);
  results.memory = std::move(memory);
  results.summary = Summarize(results.records);
  return results;
}

MemoryPoint Sample(double t, uint64_t allocated) {
  MemoryPoint p;
  p.time_s = t;
  p.peer = "ipv4:127.0.0.1:50051";
  p.device = "cuda:0";
  p.kind = "sample";
  p.allocated_bytes = allocated;
  p.reserved_bytes = allocated * 2;
  p.total_bytes = 80ull << 30;
  return p;
}

// No NaN or infinity may reach the markup (browsers drop such elements silently).
void ExpectFiniteMarkup(const std::string& svg) {
  EXPECT_FALSE(Contains(svg, "nan")) << svg;
  EXPECT_FALSE(Contains(svg, "inf")) << svg;
}

TEST(BenchReport, CsvFieldsAreQuotedOnlyWhenNeeded) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField(""), "");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(CsvField("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(CsvField("cr\r"), "\"cr\r\"");
}

TEST(BenchReport, RequestsCsvHasAHeaderAndOneRowPerRequest) {
  std::ostringstream out;
  WriteRequestsCsv(out, {Record(0, "OK", 0, 0.5), Record(1, "NOT_FOUND", 0.1, 0.2)});
  const std::string csv = out.str();
  EXPECT_EQ(csv.rfind("index,warmup,template,pipeline,scheduled_s,start_s,end_s,latency_s,", 0),
            0u);
  EXPECT_TRUE(Contains(csv, "\n0,0,tiny,tiny,0.000000,0.000000,0.500000,0.500000,0.250000,OK,"));
  // The error message holds a comma, quotes and a newline: one quoted field.
  EXPECT_TRUE(Contains(csv, ",\"no pipeline named 'x, \"\"y\"\"'\nin the repository\"\n"));
  std::ostringstream memory;
  WriteMemoryCsv(memory, {Sample(0.25, 1024)});
  EXPECT_EQ(memory.str(),
            "time_s,peer,device,kind,allocated_bytes,reserved_bytes,total_bytes,pipeline,detail\n"
            "0.250000,ipv4:127.0.0.1:50051,cuda:0,sample,1024,2048,85899345920,,\n");
}

TEST(BenchReport, NiceTicksAreRoundAndCoverTheRange) {
  const std::vector<double> tenths = NiceTicks(0, 0.82, 10);
  ASSERT_EQ(tenths.size(), 10u);  // 0, 0.1, ..., 0.9
  for (size_t i = 0; i < tenths.size(); ++i) EXPECT_NEAR(tenths[i], 0.1 * i, 1e-12);
  const std::vector<double> t = NiceTicks(3, 97, 5);
  EXPECT_EQ(t.front(), 0);
  EXPECT_EQ(t.back(), 100);
  EXPECT_EQ(FormatTick(0.25, 0.05), "0.25");
  EXPECT_EQ(FormatTick(0.30000000000000004, 0.1), "0.3");
  EXPECT_EQ(FormatTick(40, 20), "40");
  EXPECT_GE(NiceTicks(5, 5, 5).size(), 2u);  // an empty range still gets an axis
}

TEST(BenchReport, SvgOfNoDataSaysSo) {
  Plot plot;
  plot.title = "Latency";
  plot.series.push_back({"OK", "#00f", PlotSeries::Style::kDots, {}, {}, 0});
  const std::string svg = RenderSvg(plot, 800, 300);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_TRUE(Contains(svg, ">no data</text>"));
  EXPECT_EQ(Count(svg, "<circle"), 1u);  // the legend's, no point
  ExpectFiniteMarkup(svg);
}

TEST(BenchReport, SvgOfOnePointDrawsIt) {
  for (PlotSeries::Style style : {PlotSeries::Style::kDots, PlotSeries::Style::kLine}) {
    Plot plot;
    plot.series.push_back({"one", "#00f", style, {{0, 0}}, {"the point"}, 0});
    const std::string svg = RenderSvg(plot, 800, 300);
    // The point, plus the legend's dot for a series of dots.
    EXPECT_EQ(Count(svg, "<circle"), style == PlotSeries::Style::kDots ? 2u : 1u) << svg;
    EXPECT_TRUE(style != PlotSeries::Style::kDots || Contains(svg, "<title>the point</title>"));
    EXPECT_FALSE(Contains(svg, "no data"));
    ExpectFiniteMarkup(svg);
  }
  Plot bars;
  bars.series.push_back({"rate", "#00f", PlotSeries::Style::kBars, {{2, 5}}, {}, 0.5});
  bars.lines.push_back({5, "mean <5>", "#0a0"});
  const std::string svg = RenderSvg(bars, 800, 300);
  EXPECT_EQ(Count(svg, "<rect x="), 3u);  // the background, the legend's swatch and the bar
  EXPECT_TRUE(Contains(svg, "mean &lt;5&gt;"));
  ExpectFiniteMarkup(svg);
}

TEST(BenchReport, HtmlIsSelfContainedAndHasEveryChart) {
  const BenchResults results = Results(
      {Record(0, "OK", 0, 0.3), Record(1, "OK", 0.1, 0.5), Record(2, "NOT_FOUND", 0.2, 0.21)},
      {Sample(0, 1 << 20), Sample(0.25, 3 << 20)});
  const std::string html = RenderHtml(results);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(Count(html, "<svg"), 3u);
  EXPECT_TRUE(Contains(html, "qpool bench: tiny &lt;test&gt;"));
  EXPECT_TRUE(Contains(html, "NOT_FOUND"));
  EXPECT_TRUE(Contains(html, "cuda:0 allocated"));
  EXPECT_TRUE(Contains(html, "p99 "));
  for (const char* external : {"<script", "http:", "https:", "url(", "@import", "<link"}) {
    EXPECT_FALSE(Contains(html, external)) << external;
  }
  ExpectFiniteMarkup(html);
}

TEST(BenchReport, HtmlOfARunWithNothingInIt) {
  const std::string html = RenderHtml(Results({}, {}));
  EXPECT_EQ(Count(html, "<svg"), 3u);
  EXPECT_TRUE(Contains(html, "no requests"));
  EXPECT_TRUE(Contains(html, "no memory samples"));
  ExpectFiniteMarkup(html);
}

TEST(BenchReport, SummaryJsonAndText) {
  RequestRecord warm = Record(0, "OK", 0, 0.1);
  warm.warmup = true;
  MemoryPoint event = Sample(0.2, 0);
  event.kind = "unload";
  event.pipeline = "tiny";
  const BenchResults results = Results({warm, Record(1, "OK", 0.1, 0.4), Record(2, "OK", 0.2, 0.6),
                                        Record(3, "NOT_FOUND", 0.3, 0.31)},
                                       {Sample(0, 100), event, Sample(0.5, 300)});
  const nlohmann::json j = SummaryJson(results);
  EXPECT_EQ(j["requests"], 3);
  EXPECT_EQ(j["ok"], 2);
  EXPECT_EQ(j["errors"], 1);
  EXPECT_EQ(j["warmup_requests"], 1);
  EXPECT_EQ(j["codes"], (nlohmann::json{{"OK", 2}, {"NOT_FOUND", 1}}));
  EXPECT_EQ(j["devices"], (nlohmann::json{{"cpu", 2}}));
  EXPECT_EQ(j["peers"]["ipv4:127.0.0.1:50051"], 3);
  EXPECT_LE(j["latency_seconds"]["p50"], j["latency_seconds"]["p99"]);
  EXPECT_EQ(j["memory"]["samples"], 2);
  EXPECT_EQ(j["memory"]["events"], 1);
  EXPECT_EQ(j["memory"]["series"][0]["peak_allocated_bytes"], 300);
  EXPECT_TRUE(j["first_progress_seconds"].is_object());

  const std::string text = SummaryText(results);
  EXPECT_TRUE(Contains(text, "3 requests in 0.50 s after 1 warm-up (OK 1)")) << text;
  EXPECT_TRUE(Contains(text, "NOT_FOUND 1  OK 2")) << text;
  EXPECT_TRUE(Contains(text, "P99 MS")) << text;
  // A message of several lines stays on one.
  EXPECT_TRUE(Contains(text, "no pipeline named 'x, \"y\"' in the repository\n")) << text;
}

TEST(BenchReport, WriteReportCreatesTheDirectoryAndFourFiles) {
  const std::string dir = testing::MakeTempDir("bench_report") + "/a/b";
  std::string error;
  ASSERT_TRUE(WriteReport(dir, Results({Record(0, "OK", 0, 0.3)}, {}), &error)) << error;
  for (const char* name : {"summary.json", "requests.csv", "memory.csv", "report.html"}) {
    std::ifstream in(dir + "/" + name);
    EXPECT_TRUE(in.good()) << name;
  }
  std::ifstream csv(dir + "/requests.csv");
  std::string line;
  size_t lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_FALSE(WriteReport(dir + "/summary.json", Results({}, {}), &error));
  EXPECT_TRUE(Contains(error, "summary.json")) << error;
  testing::RemoveTree(dir.substr(0, dir.size() - 4));
}

}  // namespace
}  // namespace qpool::cli
