#include "cli/heatmap_png.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/printable.h"
#include "watch/profile/heat_scale.h"

namespace kwatch::cli {

namespace {

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct CairoDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

constexpr double kMargin = 16;
constexpr double kLabelWidth = 230;
constexpr double kRowHeight = 16;
constexpr double kTitleHeight = 26;
constexpr double kAxisHeight = 34;
constexpr double kPanelGap = 18;
constexpr double kLegendHeight = 52;
constexpr double kMaxPlotWidth = 900;
constexpr double kMaxImageSide = 32767;
constexpr double kMaxImagePixels = 64e6;  // 256 MB of image

void SetRgb(cairo_t* cr, uint32_t rgb) {
  cairo_set_source_rgb(cr, ((rgb >> 16) & 0xff) / 255.0, ((rgb >> 8) & 0xff) / 255.0,
                       (rgb & 0xff) / 255.0);
}

void Text(cairo_t* cr, double x, double y, const std::string& s, double size, bool bold = false,
          bool right = false) {
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  double dx = 0;
  if (right) {
    cairo_text_extents_t ext;
    cairo_text_extents(cr, s.c_str(), &ext);
    dx = -ext.x_advance;
  }
  cairo_move_to(cr, x + dx, y);
  cairo_show_text(cr, s.c_str());
}

// The first `n` code points of UTF-8 text `s` (never a cut character: cairo draws only valid
// UTF-8, and stops drawing altogether at the first invalid string).
std::string Utf8Prefix(const std::string& s, size_t n) {
  size_t i = 0;
  for (size_t cps = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80 && cps++ == n) {
      break;
    }
  }
  return s.substr(0, i);
}

// The last `n` code points of UTF-8 text `s`.
std::string Utf8Suffix(const std::string& s, size_t n) {
  size_t i = s.size();
  for (size_t cps = 0; i > 0 && cps < n;) {
    --i;
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) {
      ++cps;
    }
  }
  return s.substr(i);
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (const char c : s) {
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80 ? 1 : 0;
  }
  return n;
}

std::string Seconds(uint64_t ns) {
  return absl::StrFormat("%.3gs", static_cast<double>(ns) / 1e9);
}

}  // namespace

absl::Status WriteHeatmapPng(const std::vector<HeatmapPanel>& panels, const std::string& subtitle,
                             bool log_scale, const std::string& path) {
  size_t max_cols = 1;
  uint64_t max_count = 0;
  double height = kMargin + kTitleHeight + kLegendHeight;
  for (const HeatmapPanel& p : panels) {
    max_cols = std::max(max_cols, p.columns);
    for (uint64_t c : p.counts) {
      max_count = std::max(max_count, c);
    }
    height +=
        kTitleHeight + kRowHeight * static_cast<double>(p.rows.size()) + kAxisHeight + kPanelGap;
  }
  // cairo's image surfaces stop at 32767 pixels a side.
  if (height > kMaxImageSide) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot draw %s: the heatmap would be %.0f pixels tall (cairo draws at most %d): choose "
        "fewer fields with --field",
        path, height, static_cast<int>(kMaxImageSide)));
  }
  const double cell_w = std::clamp(kMaxPlotWidth / static_cast<double>(max_cols), 2.0, 24.0);
  const double plot_w = cell_w * static_cast<double>(max_cols);
  // Wide enough for the plot, and for the title and legend when there are few columns.
  const double width = std::max({kMargin + kLabelWidth + plot_w + kMargin + 10,
                                 kMargin + kLabelWidth + std::min(plot_w, 300.0) + 90, 520.0});
  if (width * height > kMaxImagePixels) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot draw %s: the heatmap would be %.0f x %.0f pixels (at most %.0f million): choose "
        "fewer fields with --field or wider columns with --bucket-ms",
        path, width, height, kMaxImagePixels / 1e6));
  }
  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(cairo_image_surface_create(
      CAIRO_FORMAT_RGB24, static_cast<int>(width), static_cast<int>(height)));
  std::unique_ptr<cairo_t, CairoDeleter> ctx(cairo_create(surface.get()));
  cairo_t* cr = ctx.get();
  SetRgb(cr, 0xffffff);
  cairo_paint(cr);

  const watch::profile::HeatScale scale =
      log_scale ? watch::profile::HeatScale::kLog : watch::profile::HeatScale::kLinear;

  double y = kMargin;
  SetRgb(cr, 0x202020);
  // The subtitle (the recorded command) is cut to the image's width.
  // Names come from a recording: shown escaped (core/base/printable.h), valid UTF-8 for cairo.
  std::string title = absl::StrCat("kwatch storage profile  ", core::Printable(subtitle));
  const auto max_chars = static_cast<size_t>((width - 2 * kMargin) / 8.0);
  if (CodePoints(title) > max_chars && max_chars > 3) {
    title = absl::StrCat(Utf8Prefix(title, max_chars - 3), "...");
  }
  Text(cr, kMargin, y + 14, title, 14, true);
  y += kTitleHeight;
  const double x0 = kMargin + kLabelWidth;
  for (const HeatmapPanel& p : panels) {
    SetRgb(cr, 0x202020);
    Text(cr, kMargin, y + 14, Utf8Prefix(core::Printable(p.title), max_chars), 13, true);
    y += kTitleHeight;
    for (size_t r = 0; r < p.rows.size(); ++r) {
      const double ry = y + kRowHeight * static_cast<double>(r);
      SetRgb(cr, 0x303030);
      std::string label = core::Printable(p.rows[r]);
      if (CodePoints(label) > 34) {
        label = absl::StrCat("…", Utf8Suffix(label, 33));
      }
      Text(cr, x0 - 8, ry + 12, label, 11, false, /*right=*/true);
      for (size_t c = 0; c < p.columns; ++c) {
        const uint64_t n = p.counts[r * p.columns + c];
        SetRgb(cr, watch::profile::HeatRgb(n, max_count, scale));
        cairo_rectangle(cr, x0 + cell_w * static_cast<double>(c), ry, cell_w, kRowHeight - 1);
        cairo_fill(cr);
      }
      // A rule where the next row starts another cache line.
      if (r + 1 < p.rows.size() && r < p.row_lines.size() && r + 1 < p.row_lines.size() &&
          p.row_lines[r] != p.row_lines[r + 1]) {
        SetRgb(cr, 0x2060d0);
        cairo_set_line_width(cr, 1.5);
        cairo_move_to(cr, kMargin, ry + kRowHeight - 0.5);
        cairo_line_to(cr, x0 + plot_w, ry + kRowHeight - 0.5);
        cairo_stroke(cr);
      }
    }
    y += kRowHeight * static_cast<double>(p.rows.size());
    // Time axis: five ticks.
    SetRgb(cr, 0x404040);
    const double pw = cell_w * static_cast<double>(p.columns);
    for (int t = 0; t <= 4; ++t) {
      const double fx = x0 + pw * t / 4.0;
      cairo_set_line_width(cr, 1);
      cairo_move_to(cr, fx, y + 1);
      cairo_line_to(cr, fx, y + 6);
      cairo_stroke(cr);
      const uint64_t ns =
          p.start_ns + static_cast<uint64_t>(static_cast<double>(p.columns) *
                                             static_cast<double>(p.bucket_ns) * t / 4.0);
      Text(cr, fx - 12, y + 18, Seconds(ns), 10);
    }
    Text(cr, kMargin, y + 18, absl::StrCat("bucket ", Seconds(p.bucket_ns)), 10);
    y += kAxisHeight + kPanelGap;
  }
  // Legend: the ramp from a count of 1 (left) to the maximum (right).
  const double lw = std::min(plot_w, 300.0);
  const double p_min = watch::profile::HeatPosition(1, max_count, scale);
  for (int i = 0; i < 100; ++i) {
    SetRgb(cr, watch::profile::HeatRampRgb(p_min + (1.0 - p_min) * i / 99.0));
    cairo_rectangle(cr, x0 + lw * i / 100.0, y, lw / 100.0 + 0.5, 12);
    cairo_fill(cr);
  }
  SetRgb(cr, 0x303030);
  Text(cr, x0 - 8, y + 10, absl::StrCat("accesses per bucket", log_scale ? " (log)" : ""), 11,
       false, true);
  Text(cr, x0, y + 26, "1", 10);
  Text(cr, x0 + lw, y + 26, absl::StrCat(max_count), 10, false, true);
  SetRgb(cr, watch::profile::kEmptyHeatRgb);
  cairo_rectangle(cr, x0 + lw + 20, y, 12, 12);
  cairo_fill(cr);
  SetRgb(cr, 0x303030);
  Text(cr, x0 + lw + 36, y + 10, "none", 10);

  cairo_surface_flush(surface.get());
  const cairo_status_t st = cairo_surface_write_to_png(surface.get(), path.c_str());
  if (st != CAIRO_STATUS_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path, ": ", cairo_status_to_string(st)));
  }
  return absl::OkStatus();
}

}  // namespace kwatch::cli
