#pragma once

#include <memory>

class QCoreApplication;

namespace kwatch::gui {

// The Qt application object for programs outside gui/ that drive the models without a window
// (benchmarks): SessionModel needs one for its queued results. Construct it first in main(),
// keep it for the program's life; one per process.
class HeadlessApp {
 public:
  HeadlessApp(int& argc, char** argv);
  ~HeadlessApp();
  HeadlessApp(const HeadlessApp&) = delete;
  HeadlessApp& operator=(const HeadlessApp&) = delete;

 private:
  std::unique_ptr<QCoreApplication> app_;
};

}  // namespace kwatch::gui
