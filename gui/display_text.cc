#include "gui/display_text.h"

#include "core/base/printable.h"

namespace kwatch::gui {

QString DisplayText(const std::string& s) {
  return QString::fromStdString(core::Printable(s));
}

QString RichTextSafe(const QString& plain) {
  QString html = plain.toHtmlEscaped();
  html.replace(QLatin1Char('\n'), QStringLiteral("<br>"));
  return QStringLiteral("<p style='white-space:pre'>%1</p>").arg(html);
}

}  // namespace kwatch::gui
