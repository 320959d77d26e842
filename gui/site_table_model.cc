#include "gui/site_table_model.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "gui/display_text.h"
#include "gui/field_tree_model.h"

namespace kwatch::gui {

namespace {

QString BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return DisplayText(slash == std::string::npos ? path : path.substr(slash + 1));
}

}  // namespace

SiteTableModel::SiteTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void SiteTableModel::SetData(SnapshotPtr counts, SnapshotPtr names, const Selection& sel) {
  beginResetModel();
  counts_ = std::move(counts);
  names_ = std::move(names);
  rows_.clear();
  total_ = {};
  if (counts_ && counts_->profile.has_value() && sel.object < counts_->profile->objects().size()) {
    const watch::profile::StorageProfile& p = *counts_->profile;
    const std::vector<uint32_t> fields = SelectedFields(sel, p);
    absl::flat_hash_map<uint64_t, size_t> row_of;
    watch::profile::RwCounts other;
    const auto row_for = [&](uint64_t ip) -> Row& {
      auto [it, inserted] = row_of.emplace(ip, rows_.size());
      if (inserted) {
        rows_.push_back(Row{ip, false, {}, {}});
      }
      return rows_[it->second];
    };
    if (sel.fields.empty()) {
      for (const watch::profile::SiteCount& s : p.ObjectSites(sel.object)) {
        row_for(s.ip.value).counts = s.counts;
      }
      other = p.ObjectOtherSites(sel.object);
      for (uint32_t f : fields) {
        for (const watch::profile::SiteCount& s : p.FieldSites(f)) {
          if (auto it = row_of.find(s.ip.value); it != row_of.end()) {
            rows_[it->second].fields.push_back(f);
          }
        }
      }
    } else {
      for (uint32_t f : fields) {
        for (const watch::profile::SiteCount& s : p.FieldSites(f)) {
          Row& r = row_for(s.ip.value);
          r.counts += s.counts;
          r.fields.push_back(f);
        }
        other += p.FieldOtherSites(f);
      }
    }
    std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) {
      if (a.counts.total() != b.counts.total()) {
        return a.counts.total() > b.counts.total();
      }
      return a.ip < b.ip;
    });
    rows_.erase(std::remove_if(rows_.begin(), rows_.end(),
                               [](const Row& r) { return r.counts.total() == 0; }),
                rows_.end());
    for (Row& r : rows_) {
      std::sort(r.fields.begin(), r.fields.end());
      total_ += r.counts;
    }
    if (other.total() > 0) {
      rows_.push_back(Row{0, true, other, {}});
      total_ += other;
    }
  }
  endResetModel();
}

const core::store::SiteRecord* SiteTableModel::Site(uint64_t ip) const {
  for (const SnapshotPtr& s : {names_, counts_}) {
    if (s) {
      if (auto it = s->sites.find(ip); it != s->sites.end()) {
        return &it->second;
      }
    }
  }
  return nullptr;
}

int SiteTableModel::RowOfIp(uint64_t ip) const {
  for (size_t i = 0; i < rows_.size(); ++i) {
    if (!rows_[i].other && rows_[i].ip == ip) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

QString SiteTableModel::SiteLabel(int row) const {
  const Row& r = rows_[static_cast<size_t>(row)];
  if (r.other) {
    return QStringLiteral("other sites");
  }
  const core::store::SiteRecord* s = Site(r.ip);
  if (s == nullptr || s->function.empty()) {
    return QStringLiteral("0x%1").arg(r.ip, 0, 16);
  }
  return SiteLabelText(s->function, s->offset, s->inlined, s->file, s->line);
}

QString SiteTableModel::SourceText(const Row& r) const {
  if (r.other) {
    return QStringLiteral("Accesses by instructions beyond the profile's per-field site tables.");
  }
  const core::store::SiteRecord* s = Site(r.ip);
  if (s == nullptr || s->file.empty()) {
    return QStringLiteral("0x%1: no line information in the recording.").arg(r.ip, 0, 16);
  }
  if (names_) {
    if (auto it = names_->sources.find(r.ip); it != names_->sources.end()) {
      const SourceSnippet& sn = it->second;
      QString text = QStringLiteral("%1:%2\n").arg(DisplayText(sn.file), QString::number(sn.line));
      for (size_t i = 0; i < sn.lines.size(); ++i) {
        const int n = sn.first_line + static_cast<int>(i);
        text += QStringLiteral("%1 %2  %3\n")
                    .arg(n == sn.line ? QStringLiteral("▶") : QStringLiteral(" "))
                    .arg(n, 5)
                    .arg(QString::fromStdString(sn.lines[i]));
      }
      if (!s->disassembly.empty()) {
        text += QStringLiteral("\n0x%1  %2\n").arg(r.ip, 0, 16).arg(DisplayText(s->disassembly));
      }
      return text;
    }
  }
  return QStringLiteral("%1:%2\nThe source file is not readable here.")
      .arg(DisplayText(s->file), QString::number(s->line));
}

int SiteTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int SiteTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant SiteTableModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const Row& r = rows_[static_cast<size_t>(index.row())];
  switch (role) {
    case kIpRole:
      return QVariant::fromValue<quint64>(r.ip);
    case kIsOtherRole:
      return r.other;
    case kSourceRole:
      return SourceText(r);
    case kCountRole:
      switch (index.column()) {
        case kReads:
          return QVariant::fromValue<quint64>(r.counts.reads);
        case kWrites:
          return QVariant::fromValue<quint64>(r.counts.writes);
        case kTotal:
          return QVariant::fromValue<quint64>(r.counts.total());
        default:
          return {};
      }
    case Qt::TextAlignmentRole:
      return index.column() >= kReads && index.column() <= kTotal
                 ? QVariant(Qt::AlignRight | Qt::AlignVCenter)
                 : QVariant(Qt::AlignLeft | Qt::AlignVCenter);
    case Qt::ToolTipRole:
      if (index.column() == kLocation && !r.other) {
        if (const core::store::SiteRecord* s = Site(r.ip); s != nullptr && !s->file.empty()) {
          return QStringLiteral("%1:%2").arg(DisplayText(s->file), QString::number(s->line));
        }
      }
      return {};
    case Qt::DisplayRole:
      break;
    default:
      return {};
  }
  const core::store::SiteRecord* s = r.other ? nullptr : Site(r.ip);
  switch (index.column()) {
    case kFunction:
      if (r.other) {
        return QStringLiteral("(other sites)");
      }
      if (s == nullptr || s->function.empty()) {
        return QStringLiteral("0x%1").arg(r.ip, 0, 16);
      }
      return SiteFunctionText(s->function, s->offset, s->inlined);
    case kLocation:
      if (s == nullptr || s->file.empty()) {
        return QString();
      }
      return QStringLiteral("%1:%2").arg(BaseName(s->file)).arg(s->line);
    case kAddress:
      return r.other ? QString() : QStringLiteral("0x%1").arg(r.ip, 0, 16);
    case kReads:
      return QVariant::fromValue<quint64>(r.counts.reads);
    case kWrites:
      return QVariant::fromValue<quint64>(r.counts.writes);
    case kTotal:
      return QVariant::fromValue<quint64>(r.counts.total());
    case kFields: {
      if (!counts_ || !counts_->profile.has_value()) {
        return QString();
      }
      QStringList names;
      for (size_t i = 0; i < r.fields.size() && i < 4; ++i) {
        names << FieldLabel(*counts_->profile, r.fields[i]);
      }
      if (r.fields.size() > 4) {
        names << QStringLiteral("+%1 more").arg(r.fields.size() - 4);
      }
      return names.join(QStringLiteral(", "));
    }
    default:
      return {};
  }
}

QVariant SiteTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  static constexpr auto kNames = std::to_array<const char*>(
      {"Function", "Source", "Address", "Reads", "Writes", "Total", "Fields"});
  static_assert(kNames.size() == kColumnCount);
  if (section < 0 || section >= kColumnCount) {
    return {};
  }
  return QString::fromLatin1(kNames[static_cast<size_t>(section)]);
}

}  // namespace kwatch::gui
