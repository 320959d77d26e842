// `--if` conditions (watch/condition.h): Condition::Parse on any text, unsigned and signed,
// then, when it parses, Matches() on events whose values, threads and addresses come from the
// input (some without a value or an old value). Any result is fine; a crash, a sanitizer
// report (shifts, overflow, division) or a broken invariant is a bug:
//  - an error names a column inside the text (or just past it) and ends with a caret line;
//  - the counters add up: matched + missing + divisions by zero <= evaluated.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/event.h"
#include "watch/condition.h"

namespace {

// The message is "--if '<text>': <what> at column N\n  <text>\n  <caret>^" with the caret
// under byte N of the text (N-1 blanks or tabs before it).
void CheckError(const absl::Status& s, std::string_view text) {
  if (s.code() != absl::StatusCode::kInvalidArgument) {
    std::abort();  // syntax errors are InvalidArgument, nothing else can fail
  }
  const std::string_view msg(s.message().data(), s.message().size());
  const std::string prefix = "--if '" + std::string(text) + "': ";
  if (msg.substr(0, prefix.size()) != prefix) {
    std::abort();
  }
  // <what> never contains the text itself, only single tokens: the first match is the one.
  const std::string_view rest = msg.substr(prefix.size());
  const size_t at = rest.find(" at column ");
  if (at == std::string_view::npos) {
    std::abort();
  }
  size_t column = 0;
  for (size_t i = at + 11; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i) {
    column = column * 10 + static_cast<size_t>(rest[i] - '0');
  }
  if (column < 1 || column > text.size() + 1) {
    std::abort();  // a column outside the text would put the caret anywhere
  }
  const std::string tail = "\n  " + std::string(text) + "\n  " + std::string(column - 1, '.') + "^";
  if (msg.size() < tail.size()) {
    std::abort();
  }
  const std::string_view end = msg.substr(msg.size() - tail.size());
  const size_t lines = 3 + text.size() + 3;
  if (end.substr(0, lines) != std::string_view(tail).substr(0, lines) || end.back() != '^') {
    std::abort();
  }
  for (const char c : end.substr(lines, column - 1)) {
    if (c != ' ' && c != '\t') {
      std::abort();
    }
  }
}

uint64_t Take(const uint8_t*& p, const uint8_t* end) {
  uint64_t v = 0;
  const size_t n = static_cast<size_t>(end - p) < 8 ? static_cast<size_t>(end - p) : 8;
  std::memcpy(&v, p, n);
  p += n;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const bool is_signed : {false, true}) {
    auto c = kwatch::watch::Condition::Parse(
        text, kwatch::watch::ConditionOptions{.signed_values = is_signed});
    if (!c.ok()) {
      CheckError(c.status(), text);
      continue;
    }
    // Events from the input's bytes (the text itself, 16 bytes per event).
    const uint8_t* p = data;
    const uint8_t* end = data + size;
    for (int i = 0; i < 8; ++i) {
      const uint64_t a = Take(p, end);
      const uint64_t b = Take(p, end);
      kwatch::core::AccessEvent e;
      e.tid = static_cast<pid_t>(a & 0xffff);
      e.pid = static_cast<pid_t>((a >> 16) & 0xffff);
      e.cpu = static_cast<uint32_t>(a >> 32) % 3 == 0 ? kwatch::core::kUnknownCpu : 1;
      e.len = static_cast<uint32_t>(1u << ((a >> 40) % 4));
      e.access_size = (a >> 44) % 2 == 0 ? 0 : e.len;
      e.access_addr = kwatch::core::RemoteAddr{a ^ b};
      if (i % 4 != 3) {
        e.value = b;
      }
      if (i % 3 != 2) {
        e.old_value = a * 3 + static_cast<uint64_t>(i);
      }
      (void)c->Matches(e);
    }
    const kwatch::watch::ConditionStats& st = c->stats();
    if (st.evaluated != 8 ||
        st.matched + st.missing_new + st.missing_old + st.division_by_zero > st.evaluated) {
      std::abort();
    }
    (void)c->Disassemble();
  }
  // A probe condition: names are the probe's variables (paths, $names, strings), values from
  // the input's bytes, some missing.
  kwatch::watch::ConditionOptions probe;
  probe.access_names = false;
  probe.variables = {{"x", kwatch::watch::ConditionVariable::Kind::kSigned, ""},
                     {"r->len", kwatch::watch::ConditionVariable::Kind::kUnsigned, "$retval"},
                     {"comm", kwatch::watch::ConditionVariable::Kind::kString, "$comm"}};
  (void)kwatch::watch::Condition::NamesIn(text);
  auto c = kwatch::watch::Condition::Parse(text, probe);
  if (!c.ok()) {
    if (c.status().code() != absl::StatusCode::kInvalidArgument) {
      std::abort();
    }
    return 0;
  }
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  for (int i = 0; i < 4; ++i) {
    const uint64_t a = Take(p, end);
    const std::vector<std::optional<uint64_t>> numbers = {
        i == 1 ? std::nullopt : std::optional<uint64_t>(a), std::optional<uint64_t>(~a),
        std::nullopt};
    const std::string comm = i % 2 == 0 ? "prog" : std::string(text.substr(0, 15));
    const std::vector<std::optional<std::string_view>> strings = {
        std::nullopt, std::nullopt, i == 3 ? std::nullopt : std::optional<std::string_view>(comm)};
    kwatch::watch::ConditionInputs in;
    in.tid = static_cast<int64_t>(a & 0xffff);
    in.numbers = numbers;
    in.strings = strings;
    (void)c->Matches(in);
  }
  const kwatch::watch::ConditionStats& st = c->stats();
  if (st.evaluated != 4 || st.matched + st.missing_value + st.division_by_zero > st.evaluated) {
    std::abort();
  }
  (void)c->Disassemble();
  return 0;
}
