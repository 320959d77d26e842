// The kwatch-gui binary headless: `kwatch-gui --export-png OUT FILE` (what `make demo` uses)
// and its messages for bad input.
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <QImage>

#include "tests/gui/gui_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::guitest::FieldWriterRecording;
using ::kwatch::guitest::Recording;
using ::kwatch::testing::RunResult;
using ::testing::HasSubstr;

RunResult RunGui(const std::vector<std::string>& args, bool clean_env = false) {
  std::vector<std::string> argv;
  if (clean_env) {
    // No display and no platform chosen: the export must still work.
    argv = {"/usr/bin/env", "-u", "QT_QPA_PLATFORM", "-u", "DISPLAY", "-u", "WAYLAND_DISPLAY"};
  }
  argv.push_back(KWATCH_GUI_BINARY);
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = testing::Run(argv);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

TEST(Export, PngOfARecordingWithoutADisplay) {
  const Recording& rec = FieldWriterRecording();
  const std::string out = guitest::TempPath("export.png");
  const RunResult r = RunGui({"--export-png", out, rec.path}, /*clean_env=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kwatch-gui: wrote " + out + " (1600x1000): 5250 events, 8 fields"));
  QImage image(QString::fromStdString(out));
  ASSERT_FALSE(image.isNull());
  EXPECT_EQ(image.size(), QSize(1600, 1000));
}

TEST(Export, SvgAndSize) {
  const Recording& rec = FieldWriterRecording();
  const std::string out = guitest::TempPath("export.svg");
  const RunResult r = RunGui({"--size", "1200x800", "--export-svg", out, rec.path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("<svg"));
  EXPECT_THAT(text, HasSubstr("viewBox=\"0 0 1200 800\""));
}

TEST(Export, BadInputExitsWithAClearMessage) {
  const std::string out = guitest::TempPath("bad.png");
  const std::string missing = guitest::TempPath("missing.kwdb");
  RunResult r = RunGui({"--export-png", out, missing});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kwatch-gui: error: " + missing + ": no such recording"));
  EXPECT_FALSE(std::filesystem::exists(out));

  const std::string garbage = guitest::TempPath("garbage.kwdb");
  std::ofstream(garbage) << std::string(10000, '\x7f');
  r = RunGui({"--export-png", out, garbage});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err,
              HasSubstr("kwatch-gui: error: not a kwatch recording or corrupted: " + garbage));

  const Recording& rec = FieldWriterRecording();
  r = RunGui({"--export-png", "/tmp/out.gif", rec.path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("OUT must end in .png"));
  r = RunGui({"--export-png", "/nonexistent-dir/out.png", rec.path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kwatch-gui: error: cannot write /nonexistent-dir/out.png"));
  r = RunGui({"--export-png", out});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("need a recording"));
  r = RunGui({"--size", "12", "--export-png", out, rec.path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--size wants WxH"));

  // The window itself needs a display, and says so.
  r = RunGui({rec.path}, /*clean_env=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kwatch-gui: error: no display"));
}

TEST(Export, ZeroEventsStillDrawsWithANote) {
  const Recording rec = guitest::Record("zero-export", {"--rw", "g_stats.tag"},
                                        {guitest::TargetPath("field_writer"), "1", "10"});
  const std::string out = guitest::TempPath("zero.png");
  const RunResult r = RunGui({"--export-png", out, rec.path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kwatch-gui: note: " + rec.path + " holds no events"));
  EXPECT_FALSE(QImage(QString::fromStdString(out)).isNull());
}

}  // namespace
}  // namespace kwatch
