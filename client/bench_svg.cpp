#include "bench_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace qpool::cli {
namespace {

// Room around the plot area: tick labels on the left, reference-line labels on the right,
// title and legend on top, tick labels and the axis label below.
constexpr double kLeft = 64;
constexpr double kRight = 96;
constexpr double kTop = 44;
constexpr double kBottom = 44;
constexpr double kLineLabelGap = 13;  // least vertical distance between reference labels
constexpr int kMaxTicks = 100;

std::string Num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", v);
  return buffer;
}

double RoundStep(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double step : {1.0, 2.0, 5.0}) {
    if (step * magnitude >= raw * (1 - 1e-9)) return step * magnitude;
  }
  return 10 * magnitude;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void Add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

// Maps data coordinates to the plot area.
class Frame {
 public:
  Frame(double x0, double x1, double y0, double y1, double width, double height)
      : x0_(x0), x1_(x1), y0_(y0), y1_(y1), right_(width - kRight), bottom_(height - kBottom) {}
  double X(double x) const { return kLeft + (x - x0_) / (x1_ - x0_) * (right_ - kLeft); }
  double Y(double y) const { return bottom_ - (y - y0_) / (y1_ - y0_) * (bottom_ - kTop); }
  double right() const { return right_; }
  double bottom() const { return bottom_; }

 private:
  double x0_, x1_, y0_, y1_, right_, bottom_;
};

// Rough width of `text` in the 12 px sans-serif, for laying out the legend.
double TextWidth(const std::string& text) {
  double w = 0;
  for (char c : text) w += (c >= 'A' && c <= 'Z') ? 8.2 : (c == ' ' || c == '.') ? 3.6 : 6.8;
  return w;
}

double LegendEntryWidth(const PlotSeries& s) { return 22 + TextWidth(s.label) + 14; }

double LegendWidth(const Plot& plot) {
  double w = 0;
  for (const PlotSeries& s : plot.series) {
    if (!s.label.empty()) w += LegendEntryWidth(s);
  }
  return w;
}

// The legend, one row centred on `y`, ending at the plot's right edge.
void Legend(std::ostringstream& os, const Plot& plot, double width, double y) {
  double x = width - kRight;
  // Laid out right to left so that the legend ends at the plot's right edge.
  for (auto it = plot.series.rbegin(); it != plot.series.rend(); ++it) {
    if (it->label.empty()) continue;
    x -= LegendEntryWidth(*it);
    const double sx = x;
    const double sy = y;
    os << "<g>";
    switch (it->style) {
      case PlotSeries::Style::kDots:
        os << "<circle cx='" << Num(sx + 8) << "' cy='" << Num(sy) << "' r='4' fill='" << it->color
           << "'/>";
        break;
      case PlotSeries::Style::kBars:
        os << "<rect x='" << Num(sx + 2) << "' y='" << Num(sy - 5) << "' width='12' height='10' "
           << "fill='" << it->color << "'/>";
        break;
      default:
        os << "<line x1='" << Num(sx) << "' y1='" << Num(sy) << "' x2='" << Num(sx + 16) << "' y2='"
           << Num(sy) << "' stroke='" << it->color << "' stroke-width='2'"
           << (it->style == PlotSeries::Style::kDashedLine ? " stroke-dasharray='5 3'" : "")
           << "/>";
    }
    os << "<text x='" << Num(sx + 22) << "' y='" << Num(sy + 4) << "'>" << XmlEscape(it->label)
       << "</text></g>";
  }
}

void Series(std::ostringstream& os, const PlotSeries& s, const Frame& f) {
  const bool titled = !s.titles.empty() && s.titles.size() == s.points.size();
  switch (s.style) {
    case PlotSeries::Style::kDots:
      os << "<g fill='" << s.color << "' fill-opacity='0.75'>";
      for (size_t i = 0; i < s.points.size(); ++i) {
        os << "<circle cx='" << Num(f.X(s.points[i].x)) << "' cy='" << Num(f.Y(s.points[i].y))
           << "' r='2.6'";
        if (titled) {
          os << "><title>" << XmlEscape(s.titles[i]) << "</title></circle>";
        } else {
          os << "/>";
        }
      }
      os << "</g>";
      break;
    case PlotSeries::Style::kBars:
      os << "<g fill='" << s.color << "'>";
      for (size_t i = 0; i < s.points.size(); ++i) {
        const double x0 = f.X(s.points[i].x);
        const double x1 = f.X(s.points[i].x + s.bar_width);
        const double y = f.Y(s.points[i].y);
        const double base = f.Y(0);
        if (s.points[i].y == 0) continue;
        os << "<rect x='" << Num(x0) << "' y='" << Num(std::min(y, base)) << "' width='"
           << Num(std::max(0.5, x1 - x0 - 0.5)) << "' height='" << Num(std::abs(base - y)) << "'";
        if (titled) {
          os << "><title>" << XmlEscape(s.titles[i]) << "</title></rect>";
        } else {
          os << "/>";
        }
      }
      os << "</g>";
      break;
    default:
      if (s.points.empty()) break;
      if (s.points.size() == 1) {  // a line of one point: show the point
        os << "<circle cx='" << Num(f.X(s.points[0].x)) << "' cy='" << Num(f.Y(s.points[0].y))
           << "' r='3' fill='" << s.color << "'/>";
        break;
      }
      os << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.8'"
         << (s.style == PlotSeries::Style::kDashedLine ? " stroke-dasharray='6 4'" : "")
         << " points='";
      for (const PlotPoint& p : s.points) os << Num(f.X(p.x)) << "," << Num(f.Y(p.y)) << " ";
      os << "'/>";
  }
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double step = RoundStep((hi - lo) / std::max(1, target));
  const double first = std::floor(lo / step + 1e-9) * step;
  const double last = std::ceil(hi / step - 1e-9) * step;
  const int count = std::min(kMaxTicks, static_cast<int>(std::lround((last - first) / step)) + 1);
  std::vector<double> ticks;
  for (int i = 0; i < count; ++i) {
    const double t = first + step * i;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);  // no "-0"
  }
  if (ticks.size() < 2) ticks.push_back(first + step);
  return ticks;
}

std::string FormatTick(double value, double step) {
  int decimals = 0;
  if (step > 0 && step < 1) decimals = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%.*f", std::min(decimals, 9), value);
  return buffer;
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderSvg(const Plot& plot, int width, int height) {
  const double w = width;
  const double h = height;
  Range xr, yr;
  for (const PlotSeries& s : plot.series) {
    for (const PlotPoint& p : s.points) {
      xr.Add(p.x);
      if (s.style == PlotSeries::Style::kBars) xr.Add(p.x + s.bar_width);
      yr.Add(p.y);
    }
  }
  const bool has_data = !xr.empty();
  for (const PlotLine& l : plot.lines) yr.Add(l.y);
  for (const PlotBand& b : plot.bands) {
    xr.Add(b.x0);
    xr.Add(b.x1);
  }
  for (const PlotMarker& m : plot.markers) xr.Add(m.x);
  if (plot.x_end > 0) xr.Add(plot.x_end);
  if (xr.empty()) xr = Range{0, 1};
  if (yr.empty()) yr = Range{0, 1};
  xr.lo = std::min(xr.lo, 0.0);
  yr.lo = std::min(yr.lo, 0.0);
  if (!(xr.hi > xr.lo)) xr.hi = xr.lo + 1;
  if (!(yr.hi > yr.lo)) yr.hi = yr.lo + (yr.lo == 0 ? plot.y_scale : std::abs(yr.lo));
  yr.hi += (yr.hi - yr.lo) * 0.04;  // room above the highest point

  const std::vector<double> xt = NiceTicks(xr.lo, xr.hi, 10);
  std::vector<double> yt = NiceTicks(yr.lo / plot.y_scale, yr.hi / plot.y_scale, 5);
  const double ystep = yt[1] - yt[0];
  for (double& t : yt) t *= plot.y_scale;
  const Frame f(xt.front(), xt.back(), yt.front(), yt.back(), w, h);

  std::ostringstream os;
  os << "<svg viewBox='0 0 " << width << " " << height << "' width='100%' role='img' aria-label='"
     << XmlEscape(plot.title) << "' class='chart'>";
  os << "<rect x='0' y='0' width='" << width << "' height='" << height << "' fill='#fff'/>";
  // Title and legend share a row unless they would overlap (the title's 13 px bold runs wider
  // than TextWidth's 12 px).
  const bool two_rows = w - kRight - LegendWidth(plot) < kLeft + 1.15 * TextWidth(plot.title) + 16;
  os << "<text x='" << Num(kLeft) << "' y='" << (two_rows ? 16 : 26) << "' class='title'>"
     << XmlEscape(plot.title) << "</text>";
  Legend(os, plot, w, two_rows ? 33 : 22);

  // Grid and tick labels.
  os << "<g class='grid'>";
  for (double t : yt) {
    os << "<line x1='" << Num(kLeft) << "' y1='" << Num(f.Y(t)) << "' x2='" << Num(f.right())
       << "' y2='" << Num(f.Y(t)) << "'/>";
  }
  for (double t : xt) {
    os << "<line x1='" << Num(f.X(t)) << "' y1='" << Num(kTop) << "' x2='" << Num(f.X(t))
       << "' y2='" << Num(f.bottom()) << "'/>";
  }
  os << "</g><g class='tick'>";
  for (double t : yt) {
    os << "<text x='" << Num(kLeft - 6) << "' y='" << Num(f.Y(t) + 4) << "' text-anchor='end'>"
       << FormatTick(t / plot.y_scale, ystep) << "</text>";
  }
  for (double t : xt) {
    os << "<text x='" << Num(f.X(t)) << "' y='" << Num(f.bottom() + 16) << "' text-anchor='middle'>"
       << FormatTick(t, xt[1] - xt[0]) << "</text>";
  }
  os << "</g>";

  for (const PlotBand& b : plot.bands) {
    os << "<rect x='" << Num(f.X(b.x0)) << "' y='" << Num(kTop) << "' width='"
       << Num(std::max(0.0, f.X(b.x1) - f.X(b.x0))) << "' height='" << Num(f.bottom() - kTop)
       << "' fill='#64748b' fill-opacity='0.10'/>";
    os << "<text x='" << Num(f.X(b.x0) + 4) << "' y='" << Num(kTop + 13) << "' class='band'>"
       << XmlEscape(b.label) << "</text>";
  }
  if (has_data) {
    for (const PlotSeries& s : plot.series) Series(os, s, f);
  } else {
    os << "<text x='" << Num((kLeft + f.right()) / 2) << "' y='" << Num((kTop + f.bottom()) / 2)
       << "' text-anchor='middle' class='empty'>" << XmlEscape(plot.empty_text) << "</text>";
  }
  // Reference lines, their labels moved apart where lines are close (p50 near p99).
  std::vector<std::pair<double, const PlotLine*>> labels;
  for (const PlotLine& l : plot.lines) {
    const double y = f.Y(l.y);
    os << "<line x1='" << Num(kLeft) << "' y1='" << Num(y) << "' x2='" << Num(f.right()) << "' y2='"
       << Num(y) << "' stroke='" << l.color << "' stroke-width='1.5' stroke-dasharray='6 4'/>";
    labels.emplace_back(y, &l);
  }
  std::sort(labels.begin(), labels.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < labels.size(); ++i) {
    labels[i].first = std::max(labels[i].first, labels[i - 1].first + kLineLabelGap);
  }
  for (const auto& [y, l] : labels) {
    os << "<text x='" << Num(f.right() + 4) << "' y='" << Num(y + 4) << "' fill='" << l->color
       << "' class='ref'>" << XmlEscape(l->label) << "</text>";
  }
  for (const PlotMarker& m : plot.markers) {
    const double x = f.X(m.x);
    os << "<line x1='" << Num(x) << "' y1='" << Num(kTop) << "' x2='" << Num(x) << "' y2='"
       << Num(f.bottom()) << "' stroke='" << m.color
       << "' stroke-opacity='0.35' stroke-dasharray='2 3'/>";
    os << "<path d='M" << Num(x - 5) << " " << Num(kTop) << " L" << Num(x + 5) << " " << Num(kTop)
       << " L" << Num(x) << " " << Num(kTop + 8) << " Z' fill='" << m.color << "'><title>"
       << XmlEscape(m.label) << "</title></path>";
  }

  // Axes and their labels.
  os << "<g class='axis'><line x1='" << Num(kLeft) << "' y1='" << Num(f.bottom()) << "' x2='"
     << Num(f.right()) << "' y2='" << Num(f.bottom()) << "'/><line x1='" << Num(kLeft) << "' y1='"
     << Num(kTop) << "' x2='" << Num(kLeft) << "' y2='" << Num(f.bottom()) << "'/></g>";
  os << "<text x='" << Num((kLeft + f.right()) / 2) << "' y='" << Num(h - 8)
     << "' text-anchor='middle' class='label'>" << XmlEscape(plot.x_label) << "</text>";
  os << "<text transform='translate(16 " << Num((kTop + f.bottom()) / 2)
     << ") rotate(-90)' text-anchor='middle' class='label'>" << XmlEscape(plot.y_label)
     << "</text>";
  os << "</svg>";
  return os.str();
}

}  // namespace qpool::cli
