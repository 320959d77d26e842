#include "gui/exporter.h"

#include <QFileInfo>
#include <QImage>
#include <QPainter>
#include <QSvgGenerator>

namespace kwatch::gui {

absl::Status ExportWidget(QWidget* widget, const QString& path) {
  const QString suffix = QFileInfo(path).suffix().toLower();
  if (suffix == QStringLiteral("png")) {
    QImage image(widget->size() * widget->devicePixelRatioF(), QImage::Format_ARGB32);
    image.setDevicePixelRatio(widget->devicePixelRatioF());
    image.fill(widget->palette().color(QPalette::Window));
    {
      QPainter painter(&image);
      widget->render(&painter);
    }
    if (!image.save(path, "PNG")) {
      return absl::UnavailableError(QStringLiteral("cannot write %1").arg(path).toStdString());
    }
    return absl::OkStatus();
  }
  if (suffix == QStringLiteral("svg")) {
    if (!QFileInfo(QFileInfo(path).absolutePath()).isWritable()) {
      return absl::UnavailableError(QStringLiteral("cannot write %1").arg(path).toStdString());
    }
    QSvgGenerator svg;
    svg.setFileName(path);
    svg.setSize(widget->size());
    svg.setViewBox(QRect(QPoint(0, 0), widget->size()));
    svg.setTitle(widget->windowTitle());
    svg.setDescription(QStringLiteral("kwatch-gui"));
    QPainter painter;
    if (!painter.begin(&svg)) {
      return absl::UnavailableError(QStringLiteral("cannot write %1").arg(path).toStdString());
    }
    widget->render(&painter);
    painter.end();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      QStringLiteral("cannot export to %1: the name must end in .png or .svg")
          .arg(path)
          .toStdString());
}

}  // namespace kwatch::gui
