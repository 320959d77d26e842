#include "gui/gui_main.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>

#include "gui/main_window.h"
#include "gui/session_model.h"
#include "version/version.h"

namespace kwatch::gui {

namespace {

bool HasArg(int argc, char** argv, const char* prefix) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) {
      return true;
    }
  }
  return false;
}

void Err(const QString& text) {
  std::fprintf(stderr, "kwatch-gui: %s\n", text.toLocal8Bit().constData());
}

}  // namespace

int GuiMain(int argc, char** argv) {
  const bool exporting = HasArg(argc, argv, "--export-png") || HasArg(argc, argv, "--export-svg");
  const bool help =
      HasArg(argc, argv, "-h") || HasArg(argc, argv, "--help") || HasArg(argc, argv, "--version");
  // No display: a picture needs none; the window cannot open without one.
  const bool no_display =
      std::getenv("DISPLAY") == nullptr &&          // NOLINT(concurrency-mt-unsafe)
      std::getenv("WAYLAND_DISPLAY") == nullptr &&  // NOLINT(concurrency-mt-unsafe)
      std::getenv("QT_QPA_PLATFORM") == nullptr;    // NOLINT(concurrency-mt-unsafe)
  if (no_display) {
    if (!exporting && !help) {
      std::fprintf(stderr,
                   "kwatch-gui: error: no display (DISPLAY is not set). Use "
                   "`kwatch-gui --export-png OUT.png FILE` for a picture without one, or "
                   "`kwatch report FILE` in the terminal.\n");
      return 1;
    }
    setenv("QT_QPA_PLATFORM", "offscreen", 1);  // NOLINT(concurrency-mt-unsafe): before threads
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("kwatch-gui"));
  QApplication::setOrganizationName(QStringLiteral("kwatch"));
  QApplication::setApplicationVersion(QString::fromStdString(version::Full()));

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral(
      "kwatch-gui: the heatmap of a kwatch recording (kwatch ... -o FILE.kwdb): fields of the "
      "watched structures over time, the accessing sites and threads, cache lines and false "
      "sharing."));
  parser.addHelpOption();
  parser.addVersionOption();
  parser.addPositionalArgument(QStringLiteral("file"), QStringLiteral("The recording (.kwdb)"));
  const QCommandLineOption follow(QStringLiteral("follow"),
                                  QStringLiteral("Refresh while the recording grows"));
  const QCommandLineOption png(QStringLiteral("export-png"),
                               QStringLiteral("Write the window as a PNG image and exit"),
                               QStringLiteral("out.png"));
  const QCommandLineOption svg(QStringLiteral("export-svg"),
                               QStringLiteral("Write the window as an SVG drawing and exit"),
                               QStringLiteral("out.svg"));
  const QCommandLineOption size(QStringLiteral("size"),
                                QStringLiteral("Window size for exports (default 1600x1000)"),
                                QStringLiteral("WxH"), QStringLiteral("1600x1000"));
  const QCommandLineOption view(
      QStringLiteral("view"),
      QStringLiteral("Show only FROM to TO seconds after the start, at their own resolution "
                     "(the heatmap zoomed in, read from the recording's finer bins)"),
      QStringLiteral("FROM:TO"));
  parser.addOptions({follow, png, svg, size, view});
  parser.process(app);
  const QStringList files = parser.positionalArguments();
  if (files.size() > 1) {
    Err(QStringLiteral("error: one recording at a time (got %1)").arg(files.size()));
    return 2;
  }
  const QString file = files.isEmpty() ? QString() : files.first();

  std::optional<std::pair<uint64_t, uint64_t>> view_ns;
  if (parser.isSet(view)) {
    const QStringList parts = parser.value(view).split(QLatin1Char(':'));
    bool ok_from = false;
    bool ok_to = false;
    const double from = parts.size() == 2 ? parts[0].toDouble(&ok_from) : 0;
    const double to = parts.size() == 2 ? parts[1].toDouble(&ok_to) : 0;
    if (!ok_from || !ok_to || from < 0 || to <= from || to > 1e9) {
      Err(QStringLiteral("error: --view wants FROM:TO in seconds, FROM < TO (got %1)")
              .arg(parser.value(view)));
      return 2;
    }
    view_ns = std::make_pair(static_cast<uint64_t>(from * 1e9), static_cast<uint64_t>(to * 1e9));
  }

  SessionModel session;
  MainWindow window(&session);

  if (!exporting) {
    window.resize(1500, 950);
    window.show();
    if (!file.isEmpty()) {
      session.Open(file, parser.isSet(follow));
      if (view_ns.has_value()) {
        session.SetViewRange(view_ns);  // loaded once the recording is
      }
    }
    return QApplication::exec();
  }

  if (file.isEmpty()) {
    Err(QStringLiteral("error: --export-png/--export-svg need a recording to draw"));
    return 2;
  }
  if (parser.isSet(png) &&
      !parser.value(png).endsWith(QStringLiteral(".png"), Qt::CaseInsensitive)) {
    Err(QStringLiteral("error: --export-png OUT must end in .png (got %1)").arg(parser.value(png)));
    return 2;
  }
  if (parser.isSet(svg) &&
      !parser.value(svg).endsWith(QStringLiteral(".svg"), Qt::CaseInsensitive)) {
    Err(QStringLiteral("error: --export-svg OUT must end in .svg (got %1)").arg(parser.value(svg)));
    return 2;
  }
  const QStringList wh = parser.value(size).split(QLatin1Char('x'));
  const int w = wh.size() == 2 ? wh[0].toInt() : 0;
  const int h = wh.size() == 2 ? wh[1].toInt() : 0;
  if (w < 200 || h < 150 || w > 8000 || h > 8000) {
    Err(QStringLiteral("error: --size wants WxH between 200x150 and 8000x8000, not %1")
            .arg(parser.value(size)));
    return 2;
  }
  window.setAttribute(Qt::WA_DontShowOnScreen);
  window.resize(w, h);
  window.show();

  session.Open(file, false);
  if (view_ns.has_value()) {
    session.SetViewRange(view_ns);
  }
  if (!session.WaitIdle(300'000)) {
    Err(QStringLiteral("error: %1 did not load within 5 minutes").arg(file));
    return 1;
  }
  if (!session.main_snapshot()) {
    Err(QStringLiteral("error: %1").arg(session.error()));
    return 1;
  }
  // Let the layouts and the charts settle at the final size before painting.
  for (int i = 0; i < 3; ++i) {
    QApplication::processEvents();
  }
  const SnapshotPtr& snap = session.main_snapshot();
  const watch::profile::StorageProfile& p = *snap->profile;
  if (p.objects().empty()) {
    Err(QStringLiteral("note: %1 has no watched memory (a probe recording); the picture shows "
                       "no heatmap")
            .arg(file));
  } else if (p.events() == 0) {
    Err(QStringLiteral("note: %1 holds no events; the heatmap is empty").arg(file));
  }
  int status = 0;
  for (const QCommandLineOption* opt : {&png, &svg}) {
    if (!parser.isSet(*opt)) {
      continue;
    }
    const QString out = parser.value(*opt);
    const absl::Status s = window.ExportWindow(out);
    if (!s.ok()) {
      Err(QStringLiteral("error: %1").arg(QString::fromStdString(std::string{s.message()})));
      status = 1;
      continue;
    }
    Err(QStringLiteral("wrote %1 (%2x%3): %4 events, %5 fields")
            .arg(out)
            .arg(w)
            .arg(h)
            .arg(p.events())
            .arg(p.fields().size()));
  }
  return status;
}

}  // namespace kwatch::gui
