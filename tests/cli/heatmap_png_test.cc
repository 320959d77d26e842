#include "cli/heatmap_png.h"

#include <cairo.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "watch/profile/heat_scale.h"

namespace kwatch::cli {
namespace {

uint32_t PixelAt(cairo_surface_t* s, int x, int y) {
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  uint32_t px = 0;
  std::memcpy(&px, data + y * stride + x * 4, 4);
  return px & 0xffffff;
}

TEST(HeatmapPng, CellsCarryTheirCounts) {
  HeatmapPanel p;
  p.title = "g_stats";
  p.rows = {"g_stats.hits", "g_stats.misses"};
  p.row_lines = {0, 1};
  p.bucket_ns = 1000000;
  p.columns = 4;
  p.counts = {0, 5, 10, 0,  //
              1, 0, 0,  10};
  const std::string path = ::testing::TempDir() + "/heatmap_test.png";
  ASSERT_TRUE(WriteHeatmapPng({p}, "test", /*log_scale=*/false, path).ok());
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  // Four columns are narrower than the title and legend: the image is widened for them.
  EXPECT_EQ(cairo_image_surface_get_width(s), 520);
  // Plot origin: margin 16 + labels 230; rows start after two title lines (16 + 26 + 26).
  // Cells are 24 px wide (4 columns) and 16 px high.
  const int x0 = 16 + 230;
  const int y0 = 16 + 26 + 26;
  // Colours are kwatch's one heat scale (watch/profile/heat_scale.h), as in kwatch-gui.
  using watch::profile::HeatRgb;
  using watch::profile::HeatScale;
  EXPECT_EQ(PixelAt(s, x0 + 2 * 24 + 5, y0 + 5), HeatRgb(10, 10, HeatScale::kLinear));  // max
  EXPECT_EQ(PixelAt(s, x0 + 2 * 24 + 5, y0 + 5), 0x54004au);  // the ramp's darkest colour
  EXPECT_EQ(PixelAt(s, x0 + 0 * 24 + 5, y0 + 5), watch::profile::kEmptyHeatRgb);       // empty
  EXPECT_EQ(PixelAt(s, x0 + 1 * 24 + 5, y0 + 5), HeatRgb(5, 10, HeatScale::kLinear));  // 5 of 10
  EXPECT_EQ(PixelAt(s, x0 + 0 * 24 + 5, y0 + 16 + 5), HeatRgb(1, 10, HeatScale::kLinear));
  EXPECT_EQ(PixelAt(s, x0 + 3 * 24 + 5, y0 + 16 + 5), HeatRgb(10, 10, HeatScale::kLinear));
  cairo_surface_destroy(s);
  unlink(path.c_str());
}

TEST(HeatmapPng, UnwritablePathIsAnError) {
  HeatmapPanel p;
  p.rows = {"x"};
  p.columns = 1;
  p.counts = {1};
  const absl::Status s = WriteHeatmapPng({p}, "", false, "/nonexistent-dir/x.png");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/x.png"), std::string::npos);
}

}  // namespace
}  // namespace kwatch::cli
