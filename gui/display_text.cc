#include "gui/display_text.h"

#include "core/base/printable.h"

namespace kwatch::gui {

QString DisplayText(const std::string& s) {
  return QString::fromStdString(core::Printable(s));
}

QString SiteFunctionText(const std::string& function, uint64_t offset, const std::string& inlined) {
  QString t = QStringLiteral("%1+0x%2").arg(DisplayText(function), QString::number(offset, 16));
  if (!inlined.empty() && inlined != function) {
    t = QStringLiteral("%1 inlined in %2").arg(DisplayText(inlined), t);
  }
  return t;
}

QString SiteLabelText(const std::string& function, uint64_t offset, const std::string& inlined,
                      const std::string& file, int line) {
  if (file.empty()) {
    return SiteFunctionText(function, offset, inlined);
  }
  QString name = DisplayText(function);
  if (!inlined.empty() && inlined != function) {
    name = QStringLiteral("%1 inlined in %2").arg(DisplayText(inlined), name);
  }
  const std::string base = file.substr(file.rfind('/') + 1);  // npos + 1 == 0: the whole name
  return QStringLiteral("%1 (%2:%3)").arg(name, DisplayText(base), QString::number(line));
}

QString RichTextSafe(const QString& plain) {
  QString html = plain.toHtmlEscaped();
  html.replace(QLatin1Char('\n'), QStringLiteral("<br>"));
  return QStringLiteral("<p style='white-space:pre'>%1</p>").arg(html);
}

}  // namespace kwatch::gui
