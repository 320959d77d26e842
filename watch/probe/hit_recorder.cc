#include "watch/probe/hit_recorder.h"

#include "absl/strings/str_cat.h"
#include "core/base/remote_addr.h"
#include "core/base/status_macros.h"
#include "core/store/trace_records.h"
#include "watch/probe/hit_stacks.h"

namespace kwatch::watch::probe {

absl::Status AddProbes(core::store::TraceWriter& writer, const std::vector<ProbeDef>& probes,
                       uint64_t load_bias) {
  for (const ProbeDef& p : probes) {
    if (p.internal()) {
      continue;  // its hits are not recorded
    }
    core::store::ProbeRecord r;
    r.id = p.id;
    r.event = p.point.event;
    r.spec = p.spec;
    r.address = core::RemoteAddr{p.point.vaddr.value + load_bias};
    r.function = p.point.function;
    r.file = p.point.file;
    r.line = p.point.line;
    r.is_return = p.point.is_return;
    if (absl::Status s = writer.AddProbe(r); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

bool HitRecorder::Add(const ProbeHit& hit) {
  if (!error_.ok()) {
    return true;  // dropped: the session stops with the error
  }
  absl::Status s;
  if (!writer_.HasSite(hit.ip)) {
    core::store::SiteRecord site;
    site.ip = hit.ip;
    site.function = hit.probe->point.function;
    site.offset = hit.probe->point.offset;
    site.file = hit.probe->point.file;
    site.line = hit.probe->point.line;
    site.disassembly = hit.probe->point.insn_text;
    s = writer_.AddSite(site);
  }
  if (s.ok()) {
    core::store::HitRecord r;
    r.time_ns = hit.time_ns;
    r.pid = hit.pid;
    r.tid = hit.tid;
    r.cpu = hit.cpu;
    r.probe_id = hit.probe->id;
    r.ip = hit.ip;
    r.is_return = hit.probe->point.is_return;
    r.args = hit.args;
    if (!hit.stack.empty()) {
      absl::StatusOr<uint32_t> id = StackId(hit.stack);
      s = id.status();
      r.stack_id = id.value_or(0);
    }
    if (s.ok()) {
      s = writer_.AppendHit(r);
    }
  }
  if (!s.ok()) {
    error_ = s;
  }
  return true;
}

absl::StatusOr<uint32_t> HitRecorder::StackId(const std::vector<core::RemoteAddr>& stack) {
  const auto it = stack_ids_.find(stack);
  if (it != stack_ids_.end()) {
    return it->second;
  }
  core::store::StackRecord rec;
  rec.id = static_cast<uint32_t>(stack_ids_.size() + 1);
  for (size_t i = 0; i < stack.size(); ++i) {
    core::store::StackFrameRecord f;
    f.ip = stack[i];
    if (locate_) {
      const core::symbols::CodeLocation loc = locate_(FrameLookupAddress(stack, i));
      f.function = loc.function;
      f.offset = loc.offset;
      f.file = loc.file;
      f.line = loc.line;
    }
    rec.frames.push_back(std::move(f));
  }
  KW_RETURN_IF_ERROR(writer_.AddStack(rec));
  stack_ids_.emplace(stack, rec.id);
  return rec.id;
}

void HitRecorder::Flush() {
  if (error_.ok()) {
    if (absl::Status s = writer_.Flush(); !s.ok()) {
      error_ = s;
    }
  }
}

absl::Status HitRecorder::status() const {
  if (error_.ok()) {
    return absl::OkStatus();
  }
  return {error_.code(), absl::StrCat("recording failed: ", error_.message())};
}

}  // namespace kwatch::watch::probe
