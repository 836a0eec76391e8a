#include "common/capabilities.h"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <vector>

namespace strata::caps {

namespace {

constexpr const char* kNames[] = {
    "cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_fsetid", "cap_kill",
    "cap_setgid", "cap_setuid", "cap_setpcap", "cap_linux_immutable", "cap_net_bind_service",
    "cap_net_broadcast", "cap_net_admin", "cap_net_raw", "cap_ipc_lock", "cap_ipc_owner", "cap_sys_module",
    "cap_sys_rawio", "cap_sys_chroot", "cap_sys_ptrace", "cap_sys_pacct", "cap_sys_admin", "cap_sys_boot",
    "cap_sys_nice", "cap_sys_resource", "cap_sys_time", "cap_sys_tty_config", "cap_mknod", "cap_lease",
    "cap_audit_write", "cap_audit_control", "cap_setfcap", "cap_mac_override", "cap_mac_admin",
    "cap_syslog", "cap_wake_alarm", "cap_block_suspend", "cap_audit_read", "cap_perfmon", "cap_bpf",
    "cap_checkpoint_restore"};

}  // namespace

Result<Sets> get() {
  // Version 3: 64 bits as two 32-bit halves.
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (syscall(SYS_capget, &h, d) != 0) return Error::from_errno("capget", errno);
  Sets s;
  s.effective = d[0].effective | (static_cast<uint64_t>(d[1].effective) << 32);
  s.permitted = d[0].permitted | (static_cast<uint64_t>(d[1].permitted) << 32);
  s.inheritable = d[0].inheritable | (static_cast<uint64_t>(d[1].inheritable) << 32);
  return s;
}

Status set(const Sets& s) {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  d[0].effective = static_cast<uint32_t>(s.effective);
  d[1].effective = static_cast<uint32_t>(s.effective >> 32);
  d[0].permitted = static_cast<uint32_t>(s.permitted);
  d[1].permitted = static_cast<uint32_t>(s.permitted >> 32);
  d[0].inheritable = static_cast<uint32_t>(s.inheritable);
  d[1].inheritable = static_cast<uint32_t>(s.inheritable >> 32);
  if (syscall(SYS_capset, &h, d) != 0) return Error::from_errno("capset", errno);
  return {};
}

int last_cap() {
  std::ifstream f("/proc/sys/kernel/cap_last_cap");
  int n = 0;
  if (f >> n) return n;
  return CAP_LAST_CAP;
}

Status drop_bounding_except(uint64_t keep) {
  for (int c = 0; c <= last_cap() && c < 64; ++c) {
    if (keep >> c & 1) continue;
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) return Error::from_errno("prctl(PR_CAPBSET_DROP)", errno);
  }
  return {};
}

std::string names(uint64_t bits) {
  std::string out;
  for (int i = 0; i < 64; ++i) {
    if (!(bits >> i & 1)) continue;
    if (!out.empty()) out += ",";
    out += i < static_cast<int>(std::size(kNames)) ? std::string(kNames[i]) : "cap_" + std::to_string(i);
  }
  return out.empty() ? "none" : out;
}

Result<std::string> drop_all_privileges(const std::string& user) {
  std::string done;
  auto now = get();
  if (!now) return now.error();
  if (now->permitted != 0) {
    if (auto st = drop_bounding_except(0); !st) return st.error();
  }
  if (!user.empty()) {
    passwd pw{};
    passwd* found = nullptr;
    std::vector<char> buf(16384);
    if (getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found)
      return Error{"--user " + user + ": no such user"};
    // Groups, then gid, then uid: once the uid changes the others can no longer be set.
    if (initgroups(pw.pw_name, pw.pw_gid) != 0) return Error::from_errno("initgroups(" + user + ")", errno);
    if (setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid) != 0) return Error::from_errno("setgid(" + user + ")", errno);
    if (setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid) != 0) return Error::from_errno("setuid(" + user + ")", errno);
    done = "running as " + user;
  }
  (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  if (auto st = set(Sets{}); !st) return st.error();
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Error::from_errno("prctl(PR_SET_NO_NEW_PRIVS)", errno);
  if (now->permitted != 0) done += std::string(done.empty() ? "" : ", ") + "all capabilities dropped";
  return done;
}

}  // namespace strata::caps
