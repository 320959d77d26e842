// The shared main of kwatch_gui_test: offscreen Qt (no display needed), Qt's test mode for
// settings (recent files go to a throw-away place), then GoogleTest.
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <QApplication>
#include <QStandardPaths>

int main(int argc, char** argv) {
  setenv("QT_QPA_PLATFORM", "offscreen", 0);  // NOLINT(concurrency-mt-unsafe): before threads
  QStandardPaths::setTestModeEnabled(true);
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("kwatch-test"));
  QApplication::setApplicationName(QStringLiteral("kwatch-gui-test"));
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
