#include "gui/headless_app.h"

#include <QCoreApplication>

namespace kwatch::gui {

HeadlessApp::HeadlessApp(int& argc, char** argv)
    : app_(std::make_unique<QCoreApplication>(argc, argv)) {}

HeadlessApp::~HeadlessApp() = default;

}  // namespace kwatch::gui
