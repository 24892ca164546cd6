// The charts of the bench report as inline SVG: a frame with round ticks and grid lines, dots,
// lines and bars, horizontal reference lines (p50, p99), shaded x ranges (the warm-up) and
// event ticks. Self-contained markup: no scripts, fonts or external references.
#pragma once

#include <string>
#include <vector>

namespace qpool::cli {

struct PlotPoint {
  double x = 0;
  double y = 0;
};

// One set of points drawn in one style and color.
struct PlotSeries {
  enum class Style { kDots, kLine, kDashedLine, kBars };
  std::string label;  // legend entry; "" leaves it out of the legend
  std::string color;  // CSS color
  Style style = Style::kDots;
  std::vector<PlotPoint> points;  // kLine, kDashedLine: drawn in this order
  // Hover text per point (an SVG <title>); empty, or one per point.
  std::vector<std::string> titles;
  double bar_width = 0;  // kBars: each bar spans [x, x + bar_width]
};

// A horizontal line across the plot at `y`, labelled at its right end.
struct PlotLine {
  double y = 0;
  std::string label;
  std::string color;
};

// A shaded range of x, labelled at its top.
struct PlotBand {
  double x0 = 0;
  double x1 = 0;
  std::string label;
};

// A short vertical tick at the top of the plot at `x` (e.g. a memory event), with hover text.
struct PlotMarker {
  double x = 0;
  std::string label;
  std::string color;
};

struct Plot {
  std::string title;
  std::string x_label;
  std::string y_label;
  double y_scale = 1;  // tick labels show y / y_scale (seconds as ms, bytes as MiB)
  double x_end = 0;    // the x axis reaches at least this far (charts of a run line up)
  std::vector<PlotSeries> series;
  std::vector<PlotLine> lines;
  std::vector<PlotBand> bands;
  std::vector<PlotMarker> markers;
  std::string empty_text = "no data";  // shown when no series has a point
};

// About `target` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi];
// the first is <= lo and the last >= hi. hi > lo.
std::vector<double> NiceTicks(double lo, double hi, int target);

// `value` with as many decimals as a tick `step` needs: FormatTick(0.25, 0.05) == "0.25".
std::string FormatTick(double value, double step);

// &, <, >, " and ' as XML entities.
std::string XmlEscape(const std::string& text);

// The plot as one <svg> element, `width` x `height` user units, scaling to its container.
std::string RenderSvg(const Plot& plot, int width, int height);

}  // namespace qpool::cli
