#include "gui/cache_line_model.h"

#include <array>
#include <utility>

#include <QColor>
#include <QStringList>

#include "absl/container/flat_hash_map.h"
#include "gui/display_text.h"
#include "gui/field_tree_model.h"
#include "watch/profile/duration.h"

namespace kwatch::gui {

namespace {

QString SiteText(const Snapshot* names, uint64_t ip) {
  if (names != nullptr) {
    if (auto it = names->sites.find(ip); it != names->sites.end() && !it->second.function.empty()) {
      const core::store::SiteRecord& s = it->second;
      QString t = SiteFunctionText(s.function, s.offset, s.inlined);
      if (!s.file.empty()) {
        const size_t slash = s.file.rfind('/');
        t += QStringLiteral(" (%1:%2)")
                 .arg(DisplayText(slash == std::string::npos ? s.file : s.file.substr(slash + 1)),
                      QString::number(s.line));
      }
      return t;
    }
  }
  return QStringLiteral("0x%1").arg(ip, 0, 16);
}

}  // namespace

CacheLineModel::CacheLineModel(QObject* parent) : QAbstractTableModel(parent) {}

void CacheLineModel::SetData(SnapshotPtr snap, SnapshotPtr names, const Selection& sel) {
  beginResetModel();
  snap_ = std::move(snap);
  names_ = std::move(names);
  rows_.clear();
  findings_ = 0;
  if (snap_ && snap_->profile.has_value()) {
    const watch::profile::StorageProfile& p = *snap_->profile;
    absl::flat_hash_map<uint32_t, watch::profile::FalseSharingFinding> by_line;
    for (watch::profile::FalseSharingFinding& f : p.FalseSharing()) {
      const uint32_t line = f.line;
      by_line.emplace(line, std::move(f));
    }
    for (uint32_t i = 0; i < p.lines().size(); ++i) {
      const watch::profile::CacheLine& l = p.lines()[i];
      bool mine = false;
      for (uint32_t f : l.fields) {
        mine = mine || p.fields()[f].object == sel.object;
      }
      if (!mine) {
        continue;
      }
      Row r;
      r.line = i;
      if (auto it = by_line.find(i); it != by_line.end()) {
        r.finding = std::move(it->second);
        ++findings_;
      }
      rows_.push_back(std::move(r));
    }
  }
  endResetModel();
}

QString CacheLineModel::Evidence(const Row& r) const {
  const watch::profile::StorageProfile& p = profile();
  const watch::profile::CacheLine& l = p.lines()[r.line];
  if (!r.finding.has_value()) {
    return QStringLiteral(
               "line 0x%1: %2 writes by %3 thread(s); %4 false and %5 true transfers: "
               "no false sharing")
        .arg(l.addr.value, 0, 16)
        .arg(l.writes)
        .arg(l.writers.size())
        .arg(l.false_transfers)
        .arg(l.true_transfers);
  }
  const watch::profile::FalseSharingFinding& f = *r.finding;
  const uint64_t start = snap_->session.start_mono_ns;
  QString text =
      QStringLiteral(
          "FALSE SHARING on line 0x%1: %2 writes by one thread followed by "
          "a write to other bytes by another (%3 to the same bytes), from "
          "%4 to %5 after start.\n")
          .arg(f.addr.value, 0, 16)
          .arg(f.false_transfers)
          .arg(f.true_transfers)
          .arg(QString::fromStdString(
                   watch::profile::FormatDuration(f.first_ns > start ? f.first_ns - start : 0)),
               QString::fromStdString(
                   watch::profile::FormatDuration(f.last_ns > start ? f.last_ns - start : 0)));
  for (const watch::profile::FalseSharingFinding::ThreadWrites& t : f.threads) {
    QStringList fields;
    for (const auto& [field, n] : t.fields) {
      fields << QStringLiteral("%1 (%2)").arg(DisplayText(p.fields()[field].path),
                                              QString::number(n));
    }
    text += QStringLiteral("  thread %1: %2 writes to %3\n")
                .arg(t.tid)
                .arg(t.writes)
                .arg(fields.join(QStringLiteral(", ")));
    for (const watch::profile::SiteCount& s : t.top_sites) {
      text += QStringLiteral("      %1  %2\n")
                  .arg(SiteText(names_.get(), s.ip.value))
                  .arg(s.counts.writes);
    }
  }
  if (!f.shared_fields.empty()) {
    QStringList shared;
    for (uint32_t field : f.shared_fields) {
      shared << DisplayText(p.fields()[field].path);
    }
    text += QStringLiteral("  written by more than one thread: %1\n")
                .arg(shared.join(QStringLiteral(", ")));
  }
  text += QStringLiteral(
      "  Fix: move the fields each thread writes to their own 64-byte lines "
      "(alignas(64) or padding).");
  return text;
}

int CacheLineModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int CacheLineModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant CacheLineModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const Row& r = rows_[static_cast<size_t>(index.row())];
  const watch::profile::StorageProfile& p = profile();
  const watch::profile::CacheLine& l = p.lines()[r.line];
  const auto count = [&]() -> std::optional<uint64_t> {
    switch (index.column()) {
      case kWrites:
        return l.writes;
      case kWriters:
        return l.writers.size();
      case kFalseTransfers:
        return l.false_transfers;
      case kTrueTransfers:
        return l.true_transfers;
      default:
        return std::nullopt;
    }
  };
  switch (role) {
    case kLineRole:
      return QVariant::fromValue<quint64>(l.addr.value);
    case kFalseSharingRole:
      return r.finding.has_value();
    case kEvidenceRole:
    case Qt::ToolTipRole:
      return Evidence(r);
    case kCountRole: {
      const auto c = count();
      return c.has_value() ? QVariant::fromValue<quint64>(*c) : QVariant();
    }
    case Qt::BackgroundRole:
      return r.finding.has_value() ? QVariant(QColor(255, 205, 200)) : QVariant();
    case Qt::TextAlignmentRole:
      return count().has_value() ? QVariant(Qt::AlignRight | Qt::AlignVCenter)
                                 : QVariant(Qt::AlignLeft | Qt::AlignVCenter);
    case Qt::DisplayRole:
      break;
    default:
      return {};
  }
  if (const auto c = count(); c.has_value()) {
    return QVariant::fromValue<quint64>(*c);
  }
  switch (index.column()) {
    case kAddress:
      return QStringLiteral("0x%1").arg(l.addr.value, 0, 16);
    case kFields: {
      QStringList names;
      for (size_t i = 0; i < l.fields.size() && i < 6; ++i) {
        names << FieldLabel(p, l.fields[i]);
      }
      if (l.fields.size() > 6) {
        names << QStringLiteral("+%1 more").arg(l.fields.size() - 6);
      }
      return names.join(QStringLiteral(", "));
    }
    case kVerdict:
      if (r.finding.has_value()) {
        return QStringLiteral("false sharing");
      }
      if (l.writers.size() > 1 && l.true_transfers > 0) {
        return QStringLiteral("true sharing");
      }
      if (l.writers.size() > 1) {
        return QStringLiteral("several writers");
      }
      return l.writes == 0 ? QStringLiteral("no writes") : QStringLiteral("one writer");
    default:
      return {};
  }
}

QVariant CacheLineModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  static constexpr auto kNames = std::to_array<const char*>(
      {"Line", "Fields", "Writes", "Writers", "False tr.", "True tr.", "Verdict"});
  static_assert(kNames.size() == kColumnCount);
  if (section < 0 || section >= kColumnCount) {
    return {};
  }
  return QString::fromLatin1(kNames[static_cast<size_t>(section)]);
}

}  // namespace kwatch::gui
