#include "watch/session.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/expr.h"
#include "core/status_macros.h"
#include "watch/hw_probe.h"
#include "watch/page_backend.h"
#include "watch/perf_backend.h"

namespace kwatch::watch {

namespace {
constexpr uint64_t kMaxPageWatch = 64ULL << 20;
}  // namespace

absl::string_view BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kPerf:
      return "perf";
    case BackendKind::kPage:
      return "page";
  }
  return "?";
}

WatchSession::WatchSession(core::Process& proc, std::unique_ptr<core::Symbols> symbols,
                           std::vector<Watch> watches)
    : proc_(proc),
      symbols_(std::move(symbols)),
      symbolizer_(std::make_unique<core::Symbolizer>(*symbols_)),
      watches_(std::move(watches)) {}

WatchSession::~WatchSession() {
  if (backend_ != nullptr) {
    backend_->Disarm();
  }
}

absl::StatusOr<std::unique_ptr<WatchSession>> WatchSession::Create(
    core::Process& proc, std::vector<WatchRequest> requests, const SessionOptions& opts) {
  if (requests.empty()) {
    return absl::InvalidArgumentError("nothing to watch: give at least one expression");
  }
  BackendKind kind = opts.backend;
  std::string note;
  if (kind == BackendKind::kAuto) {
    const DebugTrapProbe& probe = ProbeDebugTraps();
    if (probe.delivered) {
      kind = BackendKind::kPerf;
    } else {
      kind = BackendKind::kPage;
      note = absl::StrCat("note: ", probe.detail,
                          "; using page-protection watchpoints instead (exact values and any size, "
                          "at one fault per access to the page; --backend perf forces "
                          "hardware breakpoints)");
    }
  }
  if (kind == BackendKind::kPerf) {
    const DebugTrapProbe& probe = ProbeDebugTraps();
    if (probe.accepted && !probe.delivered) {
      note = absl::StrCat("warning: ", probe.detail,
                          "; --backend perf will arm the watches but report no accesses "
                          "(--backend page works here)");
    }
  }
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::Symbols> symbols,
                      core::Symbols::ForProcess(proc.pid()));
  const core::MemoryReader reader = [&proc](core::RemoteAddr addr, std::span<uint8_t> out) {
    return proc.ReadMemory(addr, out);
  };
  std::vector<Watch> watches;
  for (auto& req : requests) {
    KW_ASSIGN_OR_RETURN(const core::Expr expr, core::ParseExpr(req.expr));
    auto resolved = symbols->Resolve(expr, reader);
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrCat("'", req.expr, "': ", resolved.status().message()));
    }
    if (req.length.has_value()) {
      resolved->length = *req.length;
    }
    if (resolved->length == 0 || resolved->length > kMaxPageWatch) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s': a watch covers 1 byte to %d MiB; this one is %d bytes",
                          resolved->display, kMaxPageWatch >> 20, resolved->length));
    }
    // Page protection watches any size; hardware keeps the one-register rule until the
    // drmgr allocator splits ranges over several slots.
    absl::Status fits = kind == BackendKind::kPage
                            ? absl::OkStatus()
                            : drmgr::CheckHardwareRange(resolved->addr, resolved->length, req.kind);
    if (!fits.ok() && opts.backend == BackendKind::kAuto && req.kind != drmgr::DrKind::kExec) {
      // Auto mode: what one debug register cannot cover, page protection can.
      kind = BackendKind::kPage;
      note = absl::StrFormat(
          "note: '%s' (%d bytes) needs more than one debug register; using page-protection "
          "watchpoints for this session (exact values, one fault per access to the page)",
          resolved->display, resolved->length);
      fits = absl::OkStatus();
    }
    if (!fits.ok()) {
      // Both backends keep the one-debug-register rule until the drmgr allocator splits
      // ranges, so that a watch means the same whichever backend runs it.
      return absl::InvalidArgumentError(absl::StrCat(
          "'", resolved->display, "' (", resolved->type_name,
          resolved->type_name.empty() ? "" : ", ", resolved->length, " bytes at ",
          absl::StrFormat("0x%x", resolved->addr.value), "): ", fits.message(),
          ". With hardware breakpoints, watch one field or use --len with an aligned 1/2/4/8; "
          "--backend page watches ranges of any size"));
    }
    if (kind == BackendKind::kPage && req.kind == drmgr::DrKind::kExec) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", resolved->display, "': --exec needs hardware breakpoints, and ",
                       note.empty() ? "the page backend was chosen" : ProbeDebugTraps().detail));
    }
    Watch w;
    w.id = static_cast<uint32_t>(watches.size());
    w.request = std::move(req);
    w.target = *std::move(resolved);
    watches.push_back(std::move(w));
  }
  for (const Watch& w : watches) {
    if (kind == BackendKind::kPage && w.request.kind == drmgr::DrKind::kExec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", w.target.display, "': --exec needs hardware breakpoints, and this session ",
          "uses page protection (", note, ")"));
    }
  }
  auto session =
      std::unique_ptr<WatchSession>(new WatchSession(proc, std::move(symbols), std::move(watches)));
  session->backend_note_ = std::move(note);
  if (kind == BackendKind::kPerf) {
    session->backend_ =
        std::make_unique<PerfBackend>(proc, session->watches_, *session->symbolizer_, opts);
  } else {
    session->backend_ = std::make_unique<PageBackend>(proc, session->watches_);
  }
  return session;
}

absl::Status WatchSession::Arm() {
  KW_RETURN_IF_ERROR(backend_->Arm());
  armed_ = true;
  return absl::OkStatus();
}

void WatchSession::Disarm() {
  backend_->Disarm();
  armed_ = false;
}

void WatchSession::Forget() {
  backend_->Forget();
  armed_ = false;
}

size_t WatchSession::Drain(absl::FunctionRef<void(const core::AccessEvent&)> sink) {
  batch_.clear();
  backend_->Collect(batch_);
  if (batch_.empty()) {
    return 0;
  }
  std::stable_sort(
      batch_.begin(), batch_.end(),
      [](const core::AccessEvent& a, const core::AccessEvent& b) { return a.time_ns < b.time_ns; });
  // Backends that cannot read values at the access: one read per watch per batch.
  std::vector<std::optional<uint64_t>> values(watches_.size());
  std::vector<bool> read(watches_.size(), false);
  size_t delivered = 0;
  for (auto& ev : batch_) {
    const Watch& w = watches_[ev.watch_id];
    if (w.request.reads_only && ev.kind == core::AccessKind::kWrite) {
      ++filtered_;
      continue;
    }
    if (!ev.value_exact && !read[ev.watch_id]) {
      read[ev.watch_id] = true;
      if (proc_.alive() && w.request.kind != drmgr::DrKind::kExec && w.target.length <= 8) {
        uint8_t buf[8] = {};
        if (proc_.ReadMemory(w.target.addr, std::span<uint8_t>(buf, w.target.length)).ok()) {
          uint64_t v = 0;
          std::memcpy(&v, buf, 8);
          values[ev.watch_id] = v;
        }
      }
    }
    if (!ev.value_exact) {
      ev.value = values[ev.watch_id];
    }
    sink(ev);
    ++delivered;
  }
  return delivered;
}

}  // namespace kwatch::watch
