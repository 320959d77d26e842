#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/kernel/btf_types.h"
#include "core/symbols/expr.h"

namespace kwatch::core::kernel {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<KernelBtf> LoadOrDie() {
  auto btf = KernelBtf::Load();
  EXPECT_TRUE(btf.ok()) << btf.status();
  return btf.ok() ? *std::move(btf) : nullptr;
}

const symbols::FieldLayout* Field(const symbols::TypeLayout& l, const std::string& path) {
  for (const symbols::FieldLayout& f : l.fields) {
    if (f.path == path) {
      return &f;
    }
  }
  return nullptr;
}

// Output of a command (stdout only).
std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    return out;
  }
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) {
    out.append(buf, n);
  }
  pclose(p);
  return out;
}

// Offsets and sizes of the direct, non-bitfield members of `type` as pahole (dwarves) reads
// them from the same BTF: an independent implementation to check kwatch's layout against.
std::map<std::string, std::pair<uint64_t, uint64_t>> PaholeMembers(const std::string& type,
                                                                   uint64_t* size) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  const std::string text =
      Capture("pahole -F btf --suppress_aligned_attribute " + type + " 2>/dev/null");
  // "\tint                        prio;                 /*   108     4 */"
  const std::regex member(R"(^\t[^\t(]*[ *]([A-Za-z_]\w*)(\[\d+\])*;\s+/\*\s+(\d+)\s+(\d+)\s+\*/)");
  const std::regex total(R"(/\* size: (\d+),)");
  std::istringstream in(text);
  std::string line;
  bool first_total = true;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, member)) {
      out[m[1]] = {std::stoull(m[3]), std::stoull(m[4])};
    } else if (first_total && std::regex_search(line, m, total)) {
      *size = std::stoull(m[1]);
      first_total = false;
    }
  }
  return out;
}

TEST(KernelBtfTest, ListHead) {
  auto btf = LoadOrDie();
  ASSERT_NE(btf, nullptr);
  auto id = btf->FindType("struct list_head");
  ASSERT_TRUE(id.ok()) << id.status();
  const symbols::TypeLayout l = btf->Layout(*id);
  EXPECT_EQ(l.type_name, "struct list_head");
  EXPECT_EQ(l.size, 16U);
  ASSERT_EQ(l.fields.size(), 2U);
  EXPECT_EQ(l.fields[0].path, ".next");
  EXPECT_EQ(l.fields[0].offset, 0U);
  EXPECT_EQ(l.fields[0].size, 8U);
  EXPECT_EQ(l.fields[0].type_name, "struct list_head *");
  EXPECT_EQ(l.fields[1].path, ".prev");
  EXPECT_EQ(l.fields[1].offset, 8U);
  EXPECT_EQ(l.fields[1].size, 8U);
}

TEST(KernelBtfTest, Timespec64) {
  auto btf = LoadOrDie();
  ASSERT_NE(btf, nullptr);
  auto id = btf->FindType("timespec64");  // a bare name finds the struct
  ASSERT_TRUE(id.ok()) << id.status();
  const symbols::TypeLayout l = btf->Layout(*id);
  EXPECT_EQ(l.type_name, "struct timespec64");
  EXPECT_EQ(l.size, 16U);
  ASSERT_EQ(l.fields.size(), 2U);
  EXPECT_EQ(l.fields[0].path, ".tv_sec");
  EXPECT_EQ(l.fields[0].type_name, "time64_t");
  EXPECT_EQ(l.fields[0].offset, 0U);
  EXPECT_EQ(l.fields[1].path, ".tv_nsec");
  EXPECT_EQ(l.fields[1].type_name, "long int");  // the BTF base type's own name
  EXPECT_EQ(l.fields[1].offset, 8U);
  EXPECT_EQ(l.fields[1].size, 8U);
}

TEST(KernelBtfTest, TaskStructAgreesWithPahole) {
  auto btf = LoadOrDie();
  ASSERT_NE(btf, nullptr);
  uint64_t pahole_size = 0;
  const auto members = PaholeMembers("task_struct", &pahole_size);
  ASSERT_GT(members.size(), 100U) << "pahole (Debian package dwarves) printed no members";
  auto id = btf->FindType("struct task_struct");
  ASSERT_TRUE(id.ok()) << id.status();
  const symbols::TypeLayout l = btf->Layout(*id);
  EXPECT_EQ(l.size, pahole_size);
  size_t checked = 0;
  for (const auto& [name, off_size] : members) {
    const symbols::FieldLayout* f = Field(l, "." + name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->depth, 0) << name;
    EXPECT_EQ(f->offset, off_size.first) << name;
    EXPECT_EQ(f->size, off_size.second) << name;
    ++checked;
  }
  EXPECT_EQ(checked, members.size());

  // 'init_task.prio'-style member paths.
  const symbols::Expr e = *symbols::ParseExpr("init_task.prio");
  auto prio = btf->Walk(*id, e.steps);
  ASSERT_TRUE(prio.ok()) << prio.status();
  EXPECT_EQ(prio->path, ".prio");
  EXPECT_EQ(prio->offset, members.at("prio").first);
  EXPECT_EQ(prio->size, 4U);
  EXPECT_EQ(prio->type_name, "int");
  // Nested: tasks.prev is 8 bytes after tasks.
  auto prev = btf->Walk(*id, symbols::ParseExpr("init_task.tasks.prev")->steps);
  ASSERT_TRUE(prev.ok()) << prev.status();
  EXPECT_EQ(prev->offset, members.at("tasks").first + 8);
  EXPECT_EQ(prev->type_name, "struct list_head *");
  // An array element: comm[3].
  auto comm = btf->Walk(*id, symbols::ParseExpr("init_task.comm[3]")->steps);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ(comm->offset, members.at("comm").first + 3);
  EXPECT_EQ(comm->size, 1U);
}

TEST(KernelBtfTest, WalkErrors) {
  auto btf = LoadOrDie();
  ASSERT_NE(btf, nullptr);
  auto id = btf->FindType("struct list_head");
  ASSERT_TRUE(id.ok());
  auto bad = btf->Walk(*id, symbols::ParseExpr("x.nope")->steps);
  EXPECT_EQ(bad.status().message(),
            "struct list_head has no member 'nope' (column 2); its members: next, prev");
  auto arrow = btf->Walk(*id, symbols::ParseExpr("x.next->prev")->steps);
  EXPECT_THAT(std::string(arrow.status().message()), HasSubstr("would follow a kernel pointer"));
  auto ts = btf->FindType("struct timespec64");
  auto idx = btf->Walk(*ts, symbols::ParseExpr("t.tv_sec[1]")->steps);
  EXPECT_THAT(std::string(idx.status().message()), HasSubstr("is a time64_t, not an array"));
  EXPECT_EQ(btf->FindType("struct no_such_struct_here").status().message(),
            "no type 'struct no_such_struct_here' in the kernel's BTF (/sys/kernel/btf/vmlinux)");
}

TEST(KernelBtfTest, PerCpuVariablesHaveTypes) {
  auto btf = LoadOrDie();
  ASSERT_NE(btf, nullptr);
  // The kernel's BTF describes per-CPU variables (and, on this kernel, no other variables).
  auto rq = btf->VarType("runqueues");
  ASSERT_TRUE(rq.has_value());
  EXPECT_EQ(btf->TypeName(*rq), "struct rq");
  EXPECT_FALSE(btf->VarType("init_task").has_value());
  EXPECT_FALSE(btf->VarType("jiffies").has_value());
}

// Hostile BTF found by fuzz/btf_fuzzer.cc (fuzz/known/btf/): names outside the string
// section, a const that refers to itself, a struct with anonymous members of its own type
// (searched exponentially before). Every query must return, bounded.
TEST(KernelBtfTest, HostileBtfFromTheFuzzer) {
  for (const char* name : {"null-name-TypeName", "null-name-MembersOf", "const-cycle-TypeName",
                           "self-nested-anonymous-members"}) {
    SCOPED_TRACE(name);
    auto btf = KernelBtf::Load(std::string(KWATCH_SOURCE_DIR) + "/fuzz/known/btf/" + name);
    ASSERT_TRUE(btf.ok()) << btf.status();
    size_t names = 0;
    for (uint32_t id = 0; id < (*btf)->type_count(); ++id) {
      const BtfTypeRef t{id};
      names += (*btf)->TypeName(t).empty() ? 0 : 1;
      (void)(*btf)->Layout(t);
      for (const std::string& m : (*btf)->MemberNames(t)) {
        symbols::ExprStep step;
        step.member = m;
        (void)(*btf)->Walk(t, {step});
      }
    }
    EXPECT_EQ(names, (*btf)->type_count());  // every type has a spelling, "?" at worst
  }
}

}  // namespace
}  // namespace kwatch::core::kernel
