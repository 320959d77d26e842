#pragma once

// Helpers shared by the viewer's tests: recordings made by running the real kwatch on the
// fixture programs (with the ground truth they print), and waiting for background loads.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gui/session_model.h"

namespace kwatch::guitest {

// What one field_writer thread says it did.
struct Truth {
  long hits_w = 0;
  long misses_w = 0;
  long flags_r = 0;
};

struct Recording {
  std::string path;
  std::map<int, Truth> truth;  // field_writer only: tid -> ground truth
  std::string out;             // kwatch's stdout and stderr
  std::string err;
  int exit_code = -1;
};

// A fresh path in the test's temporary directory (nothing there yet).
std::string TempPath(const std::string& name);

// `kwatch -q KWATCH_ARGS -o FILE -- TARGET_ARGV`; ADD_FAILUREs when kwatch fails.
Recording Record(const std::string& name, const std::vector<std::string>& kwatch_args,
                 const std::vector<std::string>& target_argv);

// field_writer THREADS ITERS watched read-write (--rw g_stats), with its truth; made once per
// process and shared (tests only read it).
const Recording& FieldWriterRecording(int threads = 3, int iters = 1000);

// The 1-based line of tests/targets/field_writer.c holding `needle` (-1 if none).
int FieldWriterLine(const std::string& needle);

// The fixture programs of tests/targets and of tests/gui/targets.
std::string TargetPath(const std::string& name);
std::string GuiTargetPath(const std::string& name);

// Processes Qt events until `done()` or `timeout_ms` passed; returns done().
bool WaitUntil(const std::function<bool()>& done, int timeout_ms = 30000);

// Opens `path` and waits until it is loaded and the detail models are filled (true), or the
// load failed (false; the session's error() says why).
bool OpenAndWait(gui::SessionModel& session, const std::string& path);

// Waits until the session's sites, threads and cache lines match its selection.
bool WaitForDetail(gui::SessionModel& session);

}  // namespace kwatch::guitest
