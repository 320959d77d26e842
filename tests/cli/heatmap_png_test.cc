#include "cli/heatmap_png.h"

#include <cairo.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace kwatch::cli {
namespace {

uint32_t PixelAt(cairo_surface_t* s, int x, int y) {
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  uint32_t px = 0;
  std::memcpy(&px, data + y * stride + x * 4, 4);
  return px & 0xffffff;
}

TEST(HeatRamp, EndsAndMonotoneRed) {
  EXPECT_EQ(HeatRamp(0.0), 0x1b1f5cu);
  EXPECT_EQ(HeatRamp(1.0), 0xfff3a6u);
  EXPECT_EQ(HeatRamp(-3.0), HeatRamp(0.0));
  EXPECT_EQ(HeatRamp(7.0), HeatRamp(1.0));
  EXPECT_EQ(HeatRamp(0.5), 0xc8283cu);  // the middle stop exactly
}

TEST(HeatmapPng, CellsCarryTheirCounts) {
  HeatmapPanel p;
  p.title = "g_stats";
  p.rows = {"g_stats.hits", "g_stats.misses"};
  p.row_lines = {0, 1};
  p.bucket_ns = 1000000;
  p.columns = 4;
  p.counts = {0, 5, 10, 0,  //
              1, 0, 0, 10};
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
  EXPECT_EQ(PixelAt(s, x0 + 2 * 24 + 5, y0 + 5), HeatRamp(1.0));         // hits, bucket 2: max
  EXPECT_EQ(PixelAt(s, x0 + 0 * 24 + 5, y0 + 5), 0xf2f2f2u);             // empty cell
  EXPECT_EQ(PixelAt(s, x0 + 1 * 24 + 5, y0 + 5), HeatRamp(0.08 + 0.46));  // 5 of 10
  EXPECT_EQ(PixelAt(s, x0 + 3 * 24 + 5, y0 + 16 + 5), HeatRamp(1.0));    // misses, bucket 3
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
