// cli/heatmap_png.h with names from a hostile recording: escapes, bytes that are not UTF-8 and
// long non-ASCII labels are drawn as text (cairo stops drawing altogether at the first string
// that is not valid UTF-8: the cells after it stayed white), and an image too large to draw is
// refused with the reason.
#include <cairo.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/heatmap_png.h"
#include "watch/profile/heat_scale.h"

namespace kwatch::cli {
namespace {

using ::testing::HasSubstr;

uint32_t PixelAt(cairo_surface_t* s, int x, int y) {
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  uint32_t px = 0;
  std::memcpy(&px, data + y * stride + x * 4, 4);
  return px & 0xffffff;
}

HeatmapPanel Panel(const std::string& title, const std::string& row0, const std::string& row1) {
  HeatmapPanel p;
  p.title = title;
  p.rows = {row0, row1};
  p.row_lines = {0, 1};
  p.bucket_ns = 1000000;
  p.columns = 4;
  p.counts = {0, 5, 10, 0,  //
              1, 0, 0,  10};
  return p;
}

// The cells of Panel() drawn at the places HeatmapPng.CellsCarryTheirCounts measures.
void ExpectCellsDrawn(const std::string& path) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  const int x0 = 16 + 230;
  const int y0 = 16 + 26 + 26;
  using watch::profile::HeatRgb;
  using watch::profile::HeatScale;
  EXPECT_EQ(PixelAt(s, x0 + 2 * 24 + 5, y0 + 5), HeatRgb(10, 10, HeatScale::kLinear));
  EXPECT_EQ(PixelAt(s, x0 + 1 * 24 + 5, y0 + 5), HeatRgb(5, 10, HeatScale::kLinear));
  EXPECT_EQ(PixelAt(s, x0 + 3 * 24 + 5, y0 + 16 + 5), HeatRgb(10, 10, HeatScale::kLinear));
  cairo_surface_destroy(s);
}

TEST(HeatmapPngHostile, NamesThatAreNotUtf8StillDrawEveryCell) {
  const std::string path = ::testing::TempDir() + "/heatmap_hostile.png";
  const HeatmapPanel p = Panel("g\xff\xfe\x1b[31m", "g.\xc3", "g.b\x1b]0;x\x07");
  ASSERT_TRUE(WriteHeatmapPng({p}, "kwatch \xff -o x", false, path).ok());
  ExpectCellsDrawn(path);
  unlink(path.c_str());
}

TEST(HeatmapPngHostile, LongNonAsciiLabelsAreCutBetweenCharacters) {
  // 40 two-byte characters: the label keeps its last 33, the subtitle is cut to the width;
  // cut inside a character, either would stop cairo.
  std::string accents;
  for (int i = 0; i < 40; ++i) {
    accents += "\xc3\xa9";
  }
  std::string long_subtitle;
  for (int i = 0; i < 200; ++i) {
    long_subtitle += "\xe2\x82\xac";  // the euro sign, 3 bytes
  }
  const std::string path = ::testing::TempDir() + "/heatmap_cut.png";
  ASSERT_TRUE(
      WriteHeatmapPng({Panel("g", "g." + accents, "x" + accents)}, long_subtitle, false, path)
          .ok());
  ExpectCellsDrawn(path);
  unlink(path.c_str());
}

TEST(HeatmapPngHostile, AnImageTooTallToDrawIsRefusedWithTheReason) {
  HeatmapPanel p;
  p.title = "g";
  p.columns = 2;
  for (int i = 0; i < 2100; ++i) {  // 2100 rows of 16 px
    p.rows.push_back("g.f" + std::to_string(i));
    p.row_lines.push_back(static_cast<uint64_t>(i));
    p.counts.push_back(1);
    p.counts.push_back(0);
  }
  const std::string path = ::testing::TempDir() + "/heatmap_tall.png";
  const absl::Status s = WriteHeatmapPng({p}, "", false, path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pixels tall (cairo draws at most 32767)"));
  EXPECT_THAT(s.message(), HasSubstr("--field"));
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace kwatch::cli
