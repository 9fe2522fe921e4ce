// bench/tools/fragbench_report.cc
#include "bench/tools/fragbench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "memory/size.h"

namespace tierkv::fragbench {
namespace {

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

double Pct(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
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
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

// What was replayed, in two parts: the workload, then the geometry.
std::string WorkloadLine(const Workload& w, const WorkloadStats& st) {
  std::string line = w.from_trace ? "trace " + w.name : w.name + " workload (seed " + std::to_string(w.seed) + ")";
  return line + ": " + std::to_string(w.sessions.size()) + " sessions (" + std::to_string(st.long_sessions) +
         " of 128K+ tokens), " + std::to_string(w.events.size()) + " events over " + Fixed(w.duration_s() / 3600, 2) +
         " h";
}
std::string GeometryLine(const ReplayOptions& o) {
  return FormatBytes(o.bytes_per_token) + " of KV per token, blocks of " + std::to_string(o.block_tokens) +
         " tokens (" + FormatBytes(uint64_t{o.block_tokens} * o.bytes_per_token) + " frames), contiguous reserves " +
         std::to_string(o.max_tokens) + " tokens per session";
}

// "66.5%"; two decimals near 0 and 100, so 0.01% does not read as zero (nor 99.99% as
// all); exponent form for the huge ratios of a heap that holds a whole segment for a
// few bytes.
std::string Percent(double v) {
  if (v >= 1e4) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g%%", v);
    return buf;
  }
  return Fixed(v, v < 1 || v > 99 ? 2 : 1) + "%";
}
// A table cell of `width` characters.
std::string PercentCell(double v, int width) {
  char buf[48];
  std::snprintf(buf, sizeof buf, v >= 1e5 ? "%*.2e" : "%*.2f", width, v);
  return buf;
}

// ---- SVG ----------------------------------------------------------------------------

const char* Colour(AllocatorKind k) {
  switch (k) {
    case AllocatorKind::kPaged:
      return "#1b9e77";
    case AllocatorKind::kContiguous:
      return "#d95f02";
    case AllocatorKind::kMalloc:
      return "#7570b3";
    case AllocatorKind::kMimalloc:
      return "#e7298a";
  }
  return "#000000";
}

// Round tick steps (1, 2, 5 x 10^k) covering [0, max].
struct Ticks {
  double step = 1, top = 1;
  int decimals = 0;
};
Ticks NiceTicks(double max) {
  Ticks t;
  if (!(max > 0)) max = 1;
  const double raw = max / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  t.step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  t.top = std::ceil(max / t.step - 1e-9) * t.step;
  t.decimals = t.step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(t.step) - 1e-9));
  return t;
}

struct Unit {
  const char* name;
  double divisor;
};
Unit ByteUnit(double max) {
  static const Unit kUnits[] = {
      {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  Unit u = kUnits[0];
  for (const Unit& c : kUnits) {
    if (max >= c.divisor) u = c;
  }
  return u;
}
Unit TimeUnit(double duration_s) {
  if (duration_s >= 2 * 3600) return {"h", 3600};
  if (duration_s >= 120) return {"min", 60};
  return {"s", 1};
}

// A plot area mapping data coordinates to SVG pixels.
struct Panel {
  double x, y, w, h;    // pixels
  double x_max, y_max;  // data
  double X(double v) const { return x + w * v / x_max; }
  double Y(double v) const { return y + h - h * std::min(v, y_max) / y_max; }
};

std::string Px(double v) { return Fixed(v, 1); }

void Axes(std::string& svg, const Panel& p, const Ticks& xt, const Ticks& yt, const std::string& y_label,
          const std::string& x_label, const std::string& title) {
  svg += "<text x=\"" + Px(p.x) + "\" y=\"" + Px(p.y - 10) + "\" font-size=\"14\" font-weight=\"bold\">" +
         XmlEscape(title) + "</text>\n";
  for (double v = 0; v <= yt.top + yt.step / 2; v += yt.step) {
    const double y = p.Y(v);
    svg += "<line x1=\"" + Px(p.x) + "\" y1=\"" + Px(y) + "\" x2=\"" + Px(p.x + p.w) + "\" y2=\"" + Px(y) +
           "\" stroke=\"#e3e3e3\"/>\n";
    svg += "<text x=\"" + Px(p.x - 6) + "\" y=\"" + Px(y + 4) + "\" font-size=\"11\" text-anchor=\"end\">" +
           Fixed(v, yt.decimals) + "</text>\n";
  }
  for (double v = 0; v <= p.x_max * (1 + 1e-9); v += xt.step) {
    const double x = p.X(v);
    svg += "<line x1=\"" + Px(x) + "\" y1=\"" + Px(p.y + p.h) + "\" x2=\"" + Px(x) + "\" y2=\"" + Px(p.y + p.h + 5) +
           "\" stroke=\"#333\"/>\n";
    svg += "<text x=\"" + Px(x) + "\" y=\"" + Px(p.y + p.h + 18) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           Fixed(v, xt.decimals) + "</text>\n";
  }
  svg += "<rect x=\"" + Px(p.x) + "\" y=\"" + Px(p.y) + "\" width=\"" + Px(p.w) + "\" height=\"" + Px(p.h) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
  const double ly = p.y + p.h / 2;
  svg += "<text x=\"" + Px(p.x - 52) + "\" y=\"" + Px(ly) +
         "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 " + Px(p.x - 52) + " " + Px(ly) + ")\">" +
         XmlEscape(y_label) + "</text>\n";
  svg += "<text x=\"" + Px(p.x + p.w / 2) + "\" y=\"" + Px(p.y + p.h + 36) +
         "\" font-size=\"12\" text-anchor=\"middle\">" + XmlEscape(x_label) + "</text>\n";
}

// A polyline through (t, v) points; NaN values break the line.
void Line(std::string& svg, const Panel& p, const std::vector<std::pair<double, double>>& pts, const char* colour,
          const char* extra) {
  std::string d;
  bool pen_down = false;
  for (const auto& [t, v] : pts) {
    if (std::isnan(v)) {
      pen_down = false;
      continue;
    }
    d += (pen_down ? " L" : " M") + Px(p.X(t)) + "," + Px(p.Y(v));
    pen_down = true;
  }
  if (d.empty()) return;
  svg += "<path d=\"" + d.substr(1) + "\" fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\"" + extra +
         " stroke-linejoin=\"round\"/>\n";
}

}  // namespace

std::string FormatCsv(const ReplayResult& result) {
  std::string out =
      "time_s,allocator,sessions,live_bytes,allocated_bytes,held_bytes,internal_bytes,external_bytes,"
      "waste_pct,utilisation_pct\n";
  size_t n = 0;
  for (const auto& a : result.allocators) n = std::max(n, a.samples.size());
  char time[32];
  for (size_t i = 0; i < n; ++i) {
    for (const auto& a : result.allocators) {
      if (!a.available || i >= a.samples.size()) continue;
      const Sample& s = a.samples[i];
      std::snprintf(time, sizeof time, "%.3f", s.time_s);
      out += std::string(time) + "," + AllocatorName(a.kind) + "," + std::to_string(s.sessions) + "," +
             std::to_string(s.live_bytes) + "," + std::to_string(s.allocated_bytes) + "," +
             std::to_string(s.held_bytes) + "," + std::to_string(s.internal_bytes()) + "," +
             std::to_string(s.external_bytes) + "," + Fixed(Pct(s.waste_bytes(), s.allocated_bytes), 4) + "," +
             Fixed(Pct(s.live_bytes, s.held_bytes), 4) + "\n";
    }
  }
  return out;
}

nlohmann::json SummaryJson(const Workload& w, const ReplayOptions& o, const ReplayResult& r, double elapsed_s) {
  using nlohmann::json;
  const WorkloadStats& st = r.stats;
  const bool generated = !w.from_trace;
  json workload = {{"name", w.name},
                   {"source", generated ? "generated" : "trace"},
                   {"sessions", w.sessions.size()},
                   {"events", w.events.size()},
                   {"duration_s", w.duration_s()},
                   {"long_sessions", st.long_sessions},
                   {"max_session_tokens", st.max_session_tokens},
                   {"total_tokens", st.total_tokens},
                   {"peak_live_sessions", st.peak_live_sessions},
                   {"peak_live_tokens", st.peak_live_tokens}};
  if (generated) workload["seed"] = w.seed;
  json options = {
      {"bytes_per_token", o.bytes_per_token}, {"block_tokens", o.block_tokens}, {"max_tokens", o.max_tokens},
      {"arena_bytes", o.arena_bytes},         {"samples", o.samples},           {"real_scale", o.real_scale}};
  json allocators = json::object();
  for (const AllocatorResult& a : r.allocators) {
    json j = {{"available", a.available}, {"note", a.note}};
    if (a.available) {
      const Summary& s = a.summary;
      j.update({{"waste_pct", s.waste_pct},
                {"internal_pct", s.internal_pct},
                {"external_pct", s.external_pct},
                {"utilisation_pct", s.utilisation_pct},
                {"peak_live_bytes", s.peak_live_bytes},
                {"peak_allocated_bytes", s.peak_allocated_bytes},
                {"peak_held_bytes", s.peak_held_bytes},
                {"peak_held_time_s", s.peak_held_time_s},
                {"mean_held_bytes", s.mean_held_bytes},
                {"failed_sessions", a.failed_sessions},
                {"unit_bytes", a.unit_bytes},
                {"arena_bytes", a.arena_bytes},
                {"byte_scale", a.byte_scale},
                {"replay_s", a.replay_s}});
    }
    allocators[AllocatorName(a.kind)] = std::move(j);
  }
  return json{{"tool", "fragbench"},
              {"workload", std::move(workload)},
              {"options", std::move(options)},
              {"allocators", std::move(allocators)},
              {"elapsed_s", elapsed_s}};
}

std::string FormatTable(const Workload& w, const ReplayOptions& o, const ReplayResult& r) {
  std::string out = "fragbench: " + WorkloadLine(w, r.stats) + "; " + GeometryLine(o) + "\n";
  char row[256];
  std::snprintf(row, sizeof row, "  %-11s %8s %10s %10s %8s %11s %11s %7s\n", "allocator", "waste%", "internal%",
                "external%", "util%", "peak held", "mean held", "failed");
  out += row;
  for (const AllocatorResult& a : r.allocators) {
    if (!a.available) {
      std::snprintf(row, sizeof row, "  %-11s unavailable: ", AllocatorName(a.kind));
      out += row + a.note + "\n";
      continue;
    }
    const Summary& s = a.summary;
    std::snprintf(row, sizeof row, "  %-11s %s %s %s %s %11s %11s %7u\n", AllocatorName(a.kind),
                  PercentCell(s.waste_pct, 8).c_str(), PercentCell(s.internal_pct, 10).c_str(),
                  PercentCell(s.external_pct, 10).c_str(), PercentCell(s.utilisation_pct, 8).c_str(),
                  FormatBytes(s.peak_held_bytes).c_str(), FormatBytes(static_cast<uint64_t>(s.mean_held_bytes)).c_str(),
                  a.failed_sessions);
    out += row;
  }
  out += "  waste% = (internal + external) / allocated, util% = live / held, time-averaged; see docs/fragbench.md\n";
  for (const AllocatorResult& a : r.allocators) {
    if (!a.available || a.kind < AllocatorKind::kMalloc) continue;
    out += "  " + std::string(AllocatorName(a.kind)) + ": " + a.note + "\n";
    if (a.failed_sessions > 0) {
      out += "  " + std::string(AllocatorName(a.kind)) + ": " + std::to_string(a.failed_sessions) +
             " sessions failed to allocate: is address space limited (vm.overcommit_memory=2, ulimit -v)? "
             "--real-scale 16 needs 16x less (and replays 16x smaller allocations)\n";
    }
  }
  return out;
}

std::string RenderSvg(const Workload& w, const ReplayOptions& o, const ReplayResult& r) {
  constexpr double kWidth = 1000, kHeight = 780;
  const double duration = std::max(w.duration_s(), 1e-9);
  const Unit tu = TimeUnit(duration);
  double max_bytes = 0;
  for (const auto& a : r.allocators) {
    if (!a.available) continue;
    max_bytes = std::max<double>(max_bytes, a.summary.peak_held_bytes);
    for (const Sample& s : a.samples) max_bytes = std::max<double>(max_bytes, s.held_bytes);
  }
  const Unit bu = ByteUnit(max_bytes);
  const Ticks xt = NiceTicks(duration / tu.divisor);
  const Ticks yt = NiceTicks(max_bytes / bu.divisor);
  const Ticks pt{20, 100, 0};
  // x ends where the workload ends; y at a round tick above the highest value.
  const Panel held{90, 120, 620, 330, duration / tu.divisor, yt.top};
  const Panel util{90, 550, 620, 160, duration / tu.divisor, pt.top};

  const std::string title = "tierkv fragbench: memory held and utilisation over time, " +
                            (w.from_trace ? "trace " + w.name : w.name + " workload");
  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Px(kWidth) + "\" height=\"" + Px(kHeight) +
         "\" viewBox=\"0 0 " + Px(kWidth) + " " + Px(kHeight) +
         "\" font-family=\"Helvetica, Arial, sans-serif\" fill=\"#222\">\n";
  svg += "<title>" + XmlEscape(title) + "</title>\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"" + Px(kWidth / 2) + "\" y=\"30\" font-size=\"18\" font-weight=\"bold\" text-anchor=\"middle\">" +
         XmlEscape(title) + "</text>\n";
  svg += "<text x=\"" + Px(kWidth / 2) + "\" y=\"52\" font-size=\"12\" text-anchor=\"middle\" fill=\"#555\">" +
         XmlEscape(WorkloadLine(w, r.stats)) + "</text>\n";
  svg += "<text x=\"" + Px(kWidth / 2) + "\" y=\"68\" font-size=\"12\" text-anchor=\"middle\" fill=\"#555\">" +
         XmlEscape(GeometryLine(o)) + "</text>\n";

  const std::string x_label = std::string("time (") + tu.name + ")";
  Axes(svg, held, xt, yt, std::string("memory held (") + bu.name + ")", x_label,
       "Bytes held for the KV cache (lines) and live KV bytes (dashed)");
  Axes(svg, util, xt, pt, "utilisation (%)", x_label, "Utilisation: live KV bytes / bytes held, %");

  for (const auto& a : r.allocators) {
    if (!a.available) continue;
    std::vector<std::pair<double, double>> held_pts, util_pts;
    for (const Sample& s : a.samples) {
      held_pts.emplace_back(s.time_s / tu.divisor, s.held_bytes / bu.divisor);
      util_pts.emplace_back(s.time_s / tu.divisor, s.held_bytes == 0 ? NAN : Pct(s.live_bytes, s.held_bytes));
    }
    // The exact peak usually falls between samples: draw it in the line too.
    const std::pair<double, double> peak(a.summary.peak_held_time_s / tu.divisor,
                                         a.summary.peak_held_bytes / bu.divisor);
    held_pts.insert(std::upper_bound(held_pts.begin(), held_pts.end(), peak,
                                     [](const auto& x, const auto& y) { return x.first < y.first; }),
                    peak);
    Line(svg, held, held_pts, Colour(a.kind), "");
    Line(svg, util, util_pts, Colour(a.kind), "");
  }
  // Live bytes on top, dashed, so the allocators' lines show through: the same for
  // every allocator that dropped no session; take the first.
  for (const auto& a : r.allocators) {
    if (!a.available || a.samples.empty()) continue;
    std::vector<std::pair<double, double>> pts;
    for (const Sample& s : a.samples) pts.emplace_back(s.time_s / tu.divisor, s.live_bytes / bu.divisor);
    Line(svg, held, pts, "#222222", " stroke-dasharray=\"5 4\" stroke-opacity=\"0.8\"");
    break;
  }
  // Peaks: a ring where each allocator's held bytes are highest.
  for (const auto& a : r.allocators) {
    if (!a.available) continue;
    svg += "<circle cx=\"" + Px(held.X(a.summary.peak_held_time_s / tu.divisor)) + "\" cy=\"" +
           Px(held.Y(a.summary.peak_held_bytes / bu.divisor)) + "\" r=\"5\" fill=\"none\" stroke=\"" + Colour(a.kind) +
           "\" stroke-width=\"2\"/>\n";
  }

  // Legend, right of the plots.
  double ly = 130;
  const double lx = 730;
  auto legend_line = [&](const char* colour, const char* extra) {
    svg += "<line x1=\"" + Px(lx) + "\" y1=\"" + Px(ly + 10) + "\" x2=\"" + Px(lx + 24) + "\" y2=\"" + Px(ly + 10) +
           "\" stroke=\"" + colour + "\"" + extra + "/>\n";
  };
  auto legend_text = [&](double dy, const std::string& text, const char* style) {
    svg += "<text x=\"" + Px(lx + 32) + "\" y=\"" + Px(ly + dy) + "\" " + style + ">" + XmlEscape(text) + "</text>\n";
  };
  svg += "<text x=\"" + Px(lx) + "\" y=\"" + Px(ly - 10) + "\" font-size=\"13\" font-weight=\"bold\">Legend</text>\n";
  for (const auto& a : r.allocators) {
    legend_line(Colour(a.kind), " stroke-width=\"3\"");
    legend_text(14, AllocatorName(a.kind), "font-size=\"12\" font-weight=\"bold\"");
    if (!a.available) {
      legend_text(30, "unavailable (see --json note)", "font-size=\"11\" fill=\"#555\"");
    } else {
      legend_text(30, "waste " + Percent(a.summary.waste_pct) + ", utilisation " + Percent(a.summary.utilisation_pct),
                  "font-size=\"11\" fill=\"#555\"");
      std::string peak = "peak held " + FormatBytes(a.summary.peak_held_bytes);
      if (a.failed_sessions) peak += ", " + std::to_string(a.failed_sessions) + " sessions failed";
      legend_text(45, peak, "font-size=\"11\" fill=\"#555\"");
    }
    ly += 60;
  }
  legend_line("#222222", " stroke-width=\"2\" stroke-dasharray=\"5 4\"");
  legend_text(14, "live KV bytes", "font-size=\"12\"");
  ly += 26;
  svg += "<circle cx=\"" + Px(lx + 12) + "\" cy=\"" + Px(ly + 10) +
         "\" r=\"5\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\"/>\n";
  legend_text(14, "peak held", "font-size=\"12\"");
  ly += 40;
  const char* notes[] = {"held = allocated + external",         "internal = allocated - live",
                         "external = free bytes held that the", "next request cannot use (malloc,",
                         "mimalloc: all free bytes they hold)", "waste = (internal + external) /",
                         "allocated; averages over time"};
  for (const char* n : notes) {
    svg +=
        "<text x=\"" + Px(lx) + "\" y=\"" + Px(ly) + "\" font-size=\"11\" fill=\"#555\">" + XmlEscape(n) + "</text>\n";
    ly += 15;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace tierkv::fragbench
