#include "tests/gui/gui_test_util.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include <gtest/gtest.h>

#include <QCoreApplication>
#include <QSignalSpy>

#include "absl/strings/str_cat.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"

namespace kwatch::guitest {

std::string TempPath(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/gui-", getpid(), "-", name);
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return path;
}

Recording Record(const std::string& name, const std::vector<std::string>& kwatch_args,
                 const std::vector<std::string>& target_argv) {
  Recording rec;
  rec.path = TempPath(name + ".kwdb");
  std::vector<std::string> argv = {testing::KwatchPath(), "-q"};
  argv.insert(argv.end(), kwatch_args.begin(), kwatch_args.end());
  argv.insert(argv.end(), {"-o", rec.path, "--"});
  argv.insert(argv.end(), target_argv.begin(), target_argv.end());
  auto run = testing::Run(argv);
  if (!run.ok()) {
    ADD_FAILURE() << run.status();
    return rec;
  }
  rec.out = run->out;
  rec.err = run->err;
  rec.exit_code = run->exit_code;
  EXPECT_EQ(run->exit_code, 0) << run->err;
  return rec;
}

const Recording& FieldWriterRecording(int threads, int iters) {
  static std::map<std::pair<int, int>, Recording>* cache =
      new std::map<std::pair<int, int>, Recording>;
  auto it = cache->find({threads, iters});
  if (it != cache->end()) {
    return it->second;
  }
  const std::string truth_path = TempPath(absl::StrCat("truth-", threads, "x", iters, ".jsonl"));
  // Page protection on any machine: exact old -> new values for the value views, and the
  // same recording whether or not this machine delivers debug-register traps.
  Recording rec =
      Record(absl::StrCat("fw-", threads, "x", iters), {"--backend=page", "--rw", "g_stats"},
             {TargetPath("field_writer"), std::to_string(threads), std::to_string(iters), "--truth",
              truth_path});
  std::ifstream in(truth_path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("flags_r")) {
      continue;
    }
    rec.truth[j["tid"].get<int>()] =
        Truth{j["hits_w"].get<long>(), j["misses_w"].get<long>(), j["flags_r"].get<long>()};
  }
  EXPECT_EQ(rec.truth.size(), static_cast<size_t>(threads)) << rec.err;
  return cache->emplace(std::make_pair(threads, iters), std::move(rec)).first->second;
}

int FieldWriterLine(const std::string& needle) {
  return clitest::SourceLine(needle);
}

std::string TargetPath(const std::string& name) {
  return testing::TargetPath(name);
}

std::string GuiTargetPath(const std::string& name) {
  return std::string(KWATCH_GUI_TARGETS_DIR) + "/" + name;
}

bool WaitUntil(const std::function<bool()>& done, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
    QCoreApplication::sendPostedEvents();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

bool OpenAndWait(gui::SessionModel& session, const std::string& path) {
  QSignalSpy loaded(&session, &gui::SessionModel::Loaded);
  QSignalSpy failed(&session, &gui::SessionModel::LoadFailed);
  session.Open(QString::fromStdString(path));
  if (!WaitUntil([&] { return loaded.count() > 0 || failed.count() > 0; })) {
    ADD_FAILURE() << "no load result for " << path << " in 30 s";
    return false;
  }
  if (failed.count() > 0) {
    return false;
  }
  return WaitForDetail(session);
}

bool WaitForDetail(gui::SessionModel& session) {
  const bool ok = WaitUntil([&] { return !session.detail_pending(); });
  EXPECT_TRUE(ok) << "the detail load did not finish in 30 s";
  return ok;
}

}  // namespace kwatch::guitest
