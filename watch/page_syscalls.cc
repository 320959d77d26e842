#include "watch/page_syscalls.h"

#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kwatch::watch {

namespace {

// x86-64 system call names by number (the ABI's numbers, fixed).
struct NameEntry {
  uint16_t nr;
  const char* name;
};
// clang-format off
constexpr auto kNames = std::to_array<NameEntry>({
    {0, "read"}, {1, "write"}, {2, "open"}, {3, "close"}, {4, "stat"}, {5, "fstat"}, {6, "lstat"},
    {7, "poll"}, {8, "lseek"}, {9, "mmap"}, {10, "mprotect"}, {11, "munmap"}, {12, "brk"},
    {13, "rt_sigaction"}, {14, "rt_sigprocmask"}, {15, "rt_sigreturn"}, {16, "ioctl"},
    {17, "pread64"}, {18, "pwrite64"}, {19, "readv"}, {20, "writev"}, {21, "access"}, {22, "pipe"},
    {23, "select"}, {24, "sched_yield"}, {25, "mremap"}, {26, "msync"}, {27, "mincore"},
    {28, "madvise"}, {29, "shmget"}, {30, "shmat"}, {31, "shmctl"}, {32, "dup"}, {33, "dup2"},
    {34, "pause"}, {35, "nanosleep"}, {36, "getitimer"}, {37, "alarm"}, {38, "setitimer"},
    {39, "getpid"}, {40, "sendfile"}, {41, "socket"}, {42, "connect"}, {43, "accept"},
    {44, "sendto"}, {45, "recvfrom"}, {46, "sendmsg"}, {47, "recvmsg"}, {48, "shutdown"},
    {49, "bind"}, {50, "listen"}, {51, "getsockname"}, {52, "getpeername"}, {53, "socketpair"},
    {54, "setsockopt"}, {55, "getsockopt"}, {56, "clone"}, {57, "fork"}, {58, "vfork"},
    {59, "execve"}, {60, "exit"}, {61, "wait4"}, {62, "kill"}, {63, "uname"}, {64, "semget"},
    {65, "semop"}, {66, "semctl"}, {67, "shmdt"}, {68, "msgget"}, {69, "msgsnd"}, {70, "msgrcv"},
    {71, "msgctl"}, {72, "fcntl"}, {73, "flock"}, {74, "fsync"}, {75, "fdatasync"},
    {76, "truncate"}, {77, "ftruncate"}, {78, "getdents"}, {79, "getcwd"}, {80, "chdir"},
    {81, "fchdir"}, {82, "rename"}, {83, "mkdir"}, {84, "rmdir"}, {85, "creat"}, {86, "link"},
    {87, "unlink"}, {88, "symlink"}, {89, "readlink"}, {90, "chmod"}, {91, "fchmod"},
    {92, "chown"}, {93, "fchown"}, {94, "lchown"}, {95, "umask"}, {96, "gettimeofday"},
    {97, "getrlimit"}, {98, "getrusage"}, {99, "sysinfo"}, {100, "times"}, {101, "ptrace"},
    {102, "getuid"}, {103, "syslog"}, {104, "getgid"}, {105, "setuid"}, {106, "setgid"},
    {107, "geteuid"}, {108, "getegid"}, {109, "setpgid"}, {110, "getppid"}, {111, "getpgrp"},
    {112, "setsid"}, {113, "setreuid"}, {114, "setregid"}, {115, "getgroups"}, {116, "setgroups"},
    {117, "setresuid"}, {118, "getresuid"}, {119, "setresgid"}, {120, "getresgid"},
    {121, "getpgid"}, {122, "setfsuid"}, {123, "setfsgid"}, {124, "getsid"}, {125, "capget"},
    {126, "capset"}, {127, "rt_sigpending"}, {128, "rt_sigtimedwait"}, {129, "rt_sigqueueinfo"},
    {130, "rt_sigsuspend"}, {131, "sigaltstack"}, {132, "utime"}, {133, "mknod"}, {134, "uselib"},
    {135, "personality"}, {136, "ustat"}, {137, "statfs"}, {138, "fstatfs"}, {139, "sysfs"},
    {140, "getpriority"}, {141, "setpriority"}, {142, "sched_setparam"}, {143, "sched_getparam"},
    {144, "sched_setscheduler"}, {145, "sched_getscheduler"}, {146, "sched_get_priority_max"},
    {147, "sched_get_priority_min"}, {148, "sched_rr_get_interval"}, {149, "mlock"},
    {150, "munlock"}, {151, "mlockall"}, {152, "munlockall"}, {153, "vhangup"},
    {154, "modify_ldt"}, {155, "pivot_root"}, {156, "_sysctl"}, {157, "prctl"},
    {158, "arch_prctl"}, {159, "adjtimex"}, {160, "setrlimit"}, {161, "chroot"}, {162, "sync"},
    {163, "acct"}, {164, "settimeofday"}, {165, "mount"}, {166, "umount2"}, {167, "swapon"},
    {168, "swapoff"}, {169, "reboot"}, {170, "sethostname"}, {171, "setdomainname"}, {172, "iopl"},
    {173, "ioperm"}, {174, "create_module"}, {175, "init_module"}, {176, "delete_module"},
    {177, "get_kernel_syms"}, {178, "query_module"}, {179, "quotactl"}, {180, "nfsservctl"},
    {181, "getpmsg"}, {182, "putpmsg"}, {183, "afs_syscall"}, {184, "tuxcall"}, {185, "security"},
    {186, "gettid"}, {187, "readahead"}, {188, "setxattr"}, {189, "lsetxattr"}, {190, "fsetxattr"},
    {191, "getxattr"}, {192, "lgetxattr"}, {193, "fgetxattr"}, {194, "listxattr"},
    {195, "llistxattr"}, {196, "flistxattr"}, {197, "removexattr"}, {198, "lremovexattr"},
    {199, "fremovexattr"}, {200, "tkill"}, {201, "time"}, {202, "futex"},
    {203, "sched_setaffinity"}, {204, "sched_getaffinity"}, {205, "set_thread_area"},
    {206, "io_setup"}, {207, "io_destroy"}, {208, "io_getevents"}, {209, "io_submit"},
    {210, "io_cancel"}, {211, "get_thread_area"}, {212, "lookup_dcookie"}, {213, "epoll_create"},
    {214, "epoll_ctl_old"}, {215, "epoll_wait_old"}, {216, "remap_file_pages"},
    {217, "getdents64"}, {218, "set_tid_address"}, {219, "restart_syscall"}, {220, "semtimedop"},
    {221, "fadvise64"}, {222, "timer_create"}, {223, "timer_settime"}, {224, "timer_gettime"},
    {225, "timer_getoverrun"}, {226, "timer_delete"}, {227, "clock_settime"},
    {228, "clock_gettime"}, {229, "clock_getres"}, {230, "clock_nanosleep"}, {231, "exit_group"},
    {232, "epoll_wait"}, {233, "epoll_ctl"}, {234, "tgkill"}, {235, "utimes"}, {236, "vserver"},
    {237, "mbind"}, {238, "set_mempolicy"}, {239, "get_mempolicy"}, {240, "mq_open"},
    {241, "mq_unlink"}, {242, "mq_timedsend"}, {243, "mq_timedreceive"}, {244, "mq_notify"},
    {245, "mq_getsetattr"}, {246, "kexec_load"}, {247, "waitid"}, {248, "add_key"},
    {249, "request_key"}, {250, "keyctl"}, {251, "ioprio_set"}, {252, "ioprio_get"},
    {253, "inotify_init"}, {254, "inotify_add_watch"}, {255, "inotify_rm_watch"},
    {256, "migrate_pages"}, {257, "openat"}, {258, "mkdirat"}, {259, "mknodat"}, {260, "fchownat"},
    {261, "futimesat"}, {262, "newfstatat"}, {263, "unlinkat"}, {264, "renameat"}, {265, "linkat"},
    {266, "symlinkat"}, {267, "readlinkat"}, {268, "fchmodat"}, {269, "faccessat"},
    {270, "pselect6"}, {271, "ppoll"}, {272, "unshare"}, {273, "set_robust_list"},
    {274, "get_robust_list"}, {275, "splice"}, {276, "tee"}, {277, "sync_file_range"},
    {278, "vmsplice"}, {279, "move_pages"}, {280, "utimensat"}, {281, "epoll_pwait"},
    {282, "signalfd"}, {283, "timerfd_create"}, {284, "eventfd"}, {285, "fallocate"},
    {286, "timerfd_settime"}, {287, "timerfd_gettime"}, {288, "accept4"}, {289, "signalfd4"},
    {290, "eventfd2"}, {291, "epoll_create1"}, {292, "dup3"}, {293, "pipe2"},
    {294, "inotify_init1"}, {295, "preadv"}, {296, "pwritev"}, {297, "rt_tgsigqueueinfo"},
    {298, "perf_event_open"}, {299, "recvmmsg"}, {300, "fanotify_init"}, {301, "fanotify_mark"},
    {302, "prlimit64"}, {303, "name_to_handle_at"}, {304, "open_by_handle_at"},
    {305, "clock_adjtime"}, {306, "syncfs"}, {307, "sendmmsg"}, {308, "setns"}, {309, "getcpu"},
    {310, "process_vm_readv"}, {311, "process_vm_writev"}, {312, "kcmp"}, {313, "finit_module"},
    {314, "sched_setattr"}, {315, "sched_getattr"}, {316, "renameat2"}, {317, "seccomp"},
    {318, "getrandom"}, {319, "memfd_create"}, {320, "kexec_file_load"}, {321, "bpf"},
    {322, "execveat"}, {323, "userfaultfd"}, {324, "membarrier"}, {325, "mlock2"},
    {326, "copy_file_range"}, {327, "preadv2"}, {328, "pwritev2"}, {329, "pkey_mprotect"},
    {330, "pkey_alloc"}, {331, "pkey_free"}, {332, "statx"}, {333, "io_pgetevents"}, {334, "rseq"},
    {424, "pidfd_send_signal"}, {425, "io_uring_setup"}, {426, "io_uring_enter"},
    {427, "io_uring_register"}, {428, "open_tree"}, {429, "move_mount"}, {430, "fsopen"},
    {431, "fsconfig"}, {432, "fsmount"}, {433, "fspick"}, {434, "pidfd_open"}, {435, "clone3"},
    {436, "close_range"}, {437, "openat2"}, {438, "pidfd_getfd"}, {439, "faccessat2"},
    {440, "process_madvise"}, {441, "epoll_pwait2"}, {442, "mount_setattr"}, {443, "quotactl_fd"},
    {444, "landlock_create_ruleset"}, {445, "landlock_add_rule"}, {446, "landlock_restrict_self"},
    {447, "memfd_secret"}, {448, "process_mrelease"}, {449, "futex_waitv"},
    {450, "set_mempolicy_home_node"}, {451, "cachestat"}, {452, "fchmodat2"},
    {453, "map_shadow_stack"}, {454, "futex_wake"}, {455, "futex_wait"}, {456, "futex_requeue"},
    {457, "statmount"}, {458, "listmount"}, {459, "lsm_get_self_attr"}, {460, "lsm_set_self_attr"},
    {461, "lsm_list_modules"}, {462, "mseal"},
});
// clang-format on

// The kernel's restart codes (include/linux/errno.h, not exported to user space).
constexpr int64_t kErestartSys = 512;
constexpr int64_t kErestartNoIntr = 513;
constexpr int64_t kErestartNoHand = 514;
constexpr int64_t kErestartRestartBlock = 516;

constexpr uint64_t kMaxIov = 1024;  // UIO_MAXIOV

uint64_t Load64(std::span<const uint8_t> b, size_t off) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}

void Add(SyscallModel& m, uint64_t addr, uint64_t size, KernelUse use) {
  if (addr != 0 && size != 0) {
    m.ranges.push_back({addr, size, use});
  }
}

// An iovec array of `count` entries at `iov`: the array (read by the kernel), then each
// buffer in order, used as `use`.
void AddIovecs(SyscallModel& m, uint64_t iov, uint64_t count, KernelUse use, ReadFn read) {
  count = std::min(count, kMaxIov);
  Add(m, iov, count * 16, KernelUse::kRead);
  std::vector<uint8_t> raw(count * 16);
  if (count == 0 || !read(iov, raw)) {
    m.known = false;  // the buffers are unknown: the array alone is modelled
    return;
  }
  m.data_first = static_cast<int>(m.ranges.size());
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t base = Load64(raw, i * 16);
    const uint64_t len = Load64(raw, i * 16 + 8);
    m.ranges.push_back({base, len, use});  // kept even when empty: order matters
  }
}

// struct msghdr { name, namelen(u32), iov, iovlen, control, controllen, flags(i32) }.
void AddMsghdr(SyscallModel& m, uint64_t hdr, bool receive, ReadFn read) {
  std::array<uint8_t, 56> raw{};
  Add(m, hdr, raw.size(), receive ? KernelUse::kReadWrite : KernelUse::kRead);
  if (hdr == 0 || !read(hdr, raw)) {
    m.known = false;
    return;
  }
  uint32_t namelen = 0;
  std::memcpy(&namelen, raw.data() + 8, 4);
  const KernelUse use = receive ? KernelUse::kWrite : KernelUse::kRead;
  Add(m, Load64(raw, 0), namelen, use);
  Add(m, Load64(raw, 32), Load64(raw, 40), use);
  AddIovecs(m, Load64(raw, 16), Load64(raw, 24), use, read);
}

void ModelFutex(SyscallModel& m, const std::array<uint64_t, 6>& a) {
  constexpr uint64_t kPrivate = 128;
  const uint64_t cmd = a[1] & 127;
  const bool shared = (a[1] & kPrivate) == 0;
  const uint64_t uaddr = a[0];
  const uint64_t uaddr2 = a[4];
  const uint64_t timeout = a[3];
  const auto key = [&](uint64_t addr) {
    if (shared) {
      Add(m, addr, 4, KernelUse::kPage);
    }
  };
  m.known = true;
  switch (cmd) {
    case 0:  // FUTEX_WAIT
    case 9:  // FUTEX_WAIT_BITSET
      Add(m, uaddr, 4, KernelUse::kRead);
      Add(m, timeout, 16, KernelUse::kRead);
      m.start_only = true;
      break;
    case 1:   // FUTEX_WAKE
    case 10:  // FUTEX_WAKE_BITSET
      key(uaddr);
      m.start_only = true;
      break;
    case 3:  // FUTEX_REQUEUE
      key(uaddr);
      key(uaddr2);
      m.start_only = true;
      break;
    case 4:  // FUTEX_CMP_REQUEUE
      Add(m, uaddr, 4, KernelUse::kRead);
      key(uaddr2);
      m.start_only = true;
      break;
    case 5:  // FUTEX_WAKE_OP
      key(uaddr);
      Add(m, uaddr2, 4, KernelUse::kReadWrite);
      m.start_only = true;
      break;
    case 6:   // FUTEX_LOCK_PI
    case 13:  // FUTEX_LOCK_PI2
      Add(m, uaddr, 4, KernelUse::kReadWrite);
      Add(m, timeout, 16, KernelUse::kRead);
      break;
    case 7:  // FUTEX_UNLOCK_PI
    case 8:  // FUTEX_TRYLOCK_PI
      Add(m, uaddr, 4, KernelUse::kReadWrite);
      m.start_only = true;
      break;
    case 11:  // FUTEX_WAIT_REQUEUE_PI
      Add(m, uaddr, 4, KernelUse::kRead);
      Add(m, uaddr2, 4, KernelUse::kReadWrite);
      Add(m, timeout, 16, KernelUse::kRead);
      break;
    case 12:  // FUTEX_CMP_REQUEUE_PI
      Add(m, uaddr, 4, KernelUse::kRead);
      Add(m, uaddr2, 4, KernelUse::kReadWrite);
      break;
    default:
      m.known = false;
      Add(m, uaddr, 4, KernelUse::kUnknown);
      Add(m, uaddr2, 4, KernelUse::kUnknown);
      break;
  }
}

void Buffer(SyscallModel& m, int arg, uint64_t addr, uint64_t size, bool in, bool out,
            uint32_t unit) {
  m.known = true;
  Add(m, addr, size, in && out ? KernelUse::kReadWrite : in ? KernelUse::kRead : KernelUse::kWrite);
  if (addr != 0 && size != 0) {
    m.bounce = Bounce{arg, size, in, out, unit};
  }
}

}  // namespace

SyscallModel ModelSyscall(uint64_t nr, const std::array<uint64_t, 6>& a, ReadFn read) {
  SyscallModel m;
  switch (nr) {
    case SYS_read:
    case SYS_pread64:
    case SYS_getrandom:
      Buffer(m, nr == SYS_getrandom ? 0 : 1, nr == SYS_getrandom ? a[0] : a[1],
             nr == SYS_getrandom ? a[1] : a[2], false, true, 1);
      return m;
    case SYS_write:
    case SYS_pwrite64:
      Buffer(m, 1, a[1], a[2], true, false, 1);
      return m;
    case SYS_recvfrom:
      Buffer(m, 1, a[1], a[2], false, true, 1);
      if (a[4] != 0 && a[5] != 0) {
        std::array<uint8_t, 4> len{};
        uint32_t addrlen = 0;
        if (read(a[5], len)) {
          std::memcpy(&addrlen, len.data(), len.size());
        }
        Add(m, a[4], addrlen, KernelUse::kWrite);
        Add(m, a[5], 4, KernelUse::kReadWrite);
      }
      return m;
    case SYS_sendto:
      Buffer(m, 1, a[1], a[2], true, false, 1);
      Add(m, a[4], a[5], KernelUse::kRead);
      return m;
    case SYS_epoll_wait:
    case SYS_epoll_pwait:
    case SYS_epoll_pwait2:
      // struct epoll_event is packed: 12 bytes on x86-64.
      Buffer(m, 1, a[1], std::min<uint64_t>(a[2], 1 << 20) * 12, false, true, 12);
      return m;
    case SYS_poll:
    case SYS_ppoll:
      Buffer(m, 0, a[0], std::min<uint64_t>(a[1], 1 << 20) * 8, true, true, 0);
      return m;
    case SYS_readv:
    case SYS_preadv:
    case SYS_preadv2:
      m.known = true;
      AddIovecs(m, a[1], a[2], KernelUse::kWrite, read);
      return m;
    case SYS_writev:
    case SYS_pwritev:
    case SYS_pwritev2:
      m.known = true;
      AddIovecs(m, a[1], a[2], KernelUse::kRead, read);
      return m;
    case SYS_recvmsg:
    case SYS_sendmsg:
      m.known = true;
      AddMsghdr(m, a[1], nr == SYS_recvmsg, read);
      return m;
    case SYS_futex:
      ModelFutex(m, a);
      return m;
    case SYS_clock_gettime:
      Buffer(m, 1, a[1], 16, false, true, 0);
      return m;
    case SYS_pipe:
    case SYS_pipe2:
      Buffer(m, 0, a[0], 8, false, true, 0);  // int fds[2]
      return m;
    case SYS_socketpair:
      Buffer(m, 3, a[3], 8, false, true, 0);
      return m;
    case SYS_gettimeofday:
      m.known = true;
      Add(m, a[0], 16, KernelUse::kWrite);
      Add(m, a[1], 8, KernelUse::kWrite);
      return m;
    case SYS_rt_sigreturn:  // its frame is on the stack; its registers are not arguments
    case SYS_getpid:
    case SYS_gettid:
    case SYS_getppid:
    case SYS_sched_yield:
    case SYS_close:
    case SYS_dup:
    case SYS_lseek:
    case SYS_kill:
    case SYS_tgkill:
      m.known = true;  // no pointer arguments
      return m;
    case SYS_clone:
    case SYS_clone3:
    case SYS_fork:
    case SYS_vfork:
    case SYS_execve:
    case SYS_execveat:
    case SYS_exit:
    case SYS_exit_group:
      m.lifecycle = true;
      break;
    default:
      break;
  }
  // Not modelled: each argument may point somewhere; one followed by a small number is
  // taken as a (pointer, length) pair, the usual order.
  for (size_t i = 0; i < a.size(); ++i) {
    const uint64_t next = i + 1 < a.size() ? a[i + 1] : 0;
    Add(m, a[i], next > 0 && next <= (1ULL << 20) ? next : 1, KernelUse::kUnknown);
  }
  return m;
}

std::vector<KernelRange> TouchedRanges(uint64_t nr, const SyscallModel& model, int64_t ret) {
  std::vector<KernelRange> out;
  if (!model.known) {
    return out;
  }
  bool whole = ret >= 0;
  if (nr == SYS_futex) {
    // The words are read (and written) unless the call was refused before.
    whole = ret != -EFAULT && ret != -EINVAL && ret != -ENOSYS && ret != -EPERM;
  }
  const size_t data_first =
      model.data_first >= 0 ? static_cast<size_t>(model.data_first) : model.ranges.size();
  for (size_t i = 0; i < std::min(data_first, model.ranges.size()); ++i) {
    const KernelRange& r = model.ranges[i];
    if (r.use == KernelUse::kPage || !whole) {
      continue;
    }
    if (model.bounce.has_value() && i == 0 && model.bounce->out && !model.bounce->in) {
      // A buffer the kernel filled: only what the result says.
      const uint64_t n = BounceOutBytes(*model.bounce, ret);
      if (n > 0) {
        out.push_back({r.addr, std::min(n, r.size), r.use});
      }
      continue;
    }
    if (model.bounce.has_value() && i == 0 && model.bounce->in && !model.bounce->out &&
        model.bounce->unit == 1) {
      // A buffer the kernel consumed (write): as many bytes as it took.
      if (ret > 0) {
        out.push_back({r.addr, std::min(static_cast<uint64_t>(ret), r.size), r.use});
      }
      continue;
    }
    out.push_back(r);
  }
  // Data buffers (iovecs) are filled or consumed in order, `ret` bytes in all.
  uint64_t left = ret > 0 ? static_cast<uint64_t>(ret) : 0;
  for (size_t i = data_first; i < model.ranges.size() && left > 0; ++i) {
    const KernelRange& r = model.ranges[i];
    const uint64_t n = std::min(left, r.size);
    if (n > 0) {
      out.push_back({r.addr, n, r.use});
    }
    left -= n;
  }
  return out;
}

uint64_t BounceOutBytes(const Bounce& b, int64_t ret) {
  if (!b.out || ret < 0) {
    return 0;
  }
  if (b.unit == 0) {
    return b.size;
  }
  return std::min(static_cast<uint64_t>(ret) * b.unit, b.size);
}

bool IsRestartResult(int64_t ret) {
  return ret == -kErestartSys || ret == -kErestartNoIntr || ret == -kErestartNoHand ||
         ret == -kErestartRestartBlock;
}

std::string SyscallName(uint64_t nr) {
  const auto* const it = std::lower_bound(kNames.begin(), kNames.end(), nr,
                                          [](const NameEntry& e, uint64_t n) { return e.nr < n; });
  if (it != kNames.end() && it->nr == nr) {
    return it->name;
  }
  return absl::StrCat("syscall_", nr);
}

}  // namespace kwatch::watch
