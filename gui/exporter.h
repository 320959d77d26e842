#pragma once

#include <QString>
#include <QWidget>

#include "absl/status/status.h"

namespace kwatch::gui {

// Writes what `widget` shows (with its children) to `path`: a PNG for ".png", an SVG for
// ".svg" (any case). InvalidArgument for another suffix; Unavailable naming the path when the
// file cannot be written.
absl::Status ExportWidget(QWidget* widget, const QString& path);

}  // namespace kwatch::gui
