#include "agent/container_identity.h"

#include <cctype>
#include <sstream>
#include <vector>

namespace strata::agent {
namespace {

bool is_hex(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789abcdef") == std::string::npos; }

// A pod UID inside a path component: "pod" + 8-4-4-4-12 hex, dashed (cgroupfs) or with
// underscores (systemd slices, where '-' separates the slice's parents).
std::string pod_uid_in(const std::string& part) {
  for (size_t at = part.find("pod"); at != std::string::npos; at = part.find("pod", at + 1)) {
    // "pod" starts the component or follows a '-' of a systemd slice name.
    if (at != 0 && part[at - 1] != '-') continue;
    std::string uid = part.substr(at + 3, 36);
    if (uid.size() != 36) continue;
    bool ok = true;
    for (size_t i = 0; i < uid.size() && ok; ++i) {
      bool sep = i == 8 || i == 13 || i == 18 || i == 23;
      if (sep) {
        ok = uid[i] == '-' || uid[i] == '_';
        uid[i] = '-';
      } else {
        ok = std::isxdigit(static_cast<unsigned char>(uid[i])) != 0;
      }
    }
    if (!ok) continue;
    std::string rest = part.substr(at + 3 + 36);
    if (rest.empty() || rest == ".slice") return uid;
  }
  return "";
}

// A container id inside a path component: "<runtime>-<64 hex>.scope" (systemd driver) or a bare
// 64-hex component (cgroupfs driver; the runtime from its parent when it says).
std::string container_id_in(const std::string& part, const std::string& parent) {
  static const std::vector<std::pair<std::string, std::string>> prefixes = {
      {"cri-containerd-", "containerd://"}, {"docker-", "docker://"}, {"crio-", "cri-o://"},
      {"libpod-", "podman://"}};
  const std::string scope = ".scope";
  if (part.size() > scope.size() && part.compare(part.size() - scope.size(), scope.size(), scope) == 0) {
    std::string body = part.substr(0, part.size() - scope.size());
    for (const auto& [prefix, scheme] : prefixes) {
      if (body.rfind(prefix, 0) != 0) continue;
      std::string id = body.substr(prefix.size());
      // crio-conmon-<id> is CRI-O's monitor, not the container.
      if (id.size() == 64 && is_hex(id)) return scheme + id;
    }
    return "";
  }
  if (part.size() == 64 && is_hex(part)) return parent == "docker" ? "docker://" + part : part;
  return "";
}

}  // namespace

ContainerIdentity parse_cgroup_identity(const std::string& proc_cgroup) {
  ContainerIdentity id;
  std::stringstream lines(proc_cgroup);
  std::string line;
  // Every hierarchy names the same pod and container; the first line that says wins.
  while (std::getline(lines, line) && (id.pod_uid.empty() || id.container_id.empty())) {
    // "ID:CONTROLLERS:PATH"; PATH may itself hold ':'.
    auto c1 = line.find(':');
    auto c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string path = line.substr(c2 + 1);
    std::stringstream parts(path);
    std::string part, parent, pod, container;
    while (std::getline(parts, part, '/')) {
      if (part.empty()) continue;
      if (std::string u = pod_uid_in(part); !u.empty()) pod = u;
      if (std::string c = container_id_in(part, parent); !c.empty()) container = c;
      parent = part;
    }
    if (id.pod_uid.empty() && !pod.empty()) id.pod_uid = pod;
    if (id.container_id.empty() && !container.empty()) id.container_id = container;
  }
  return id;
}

void add_env_identity(const std::map<std::string, std::string>& env, ContainerIdentity& id) {
  auto get = [&](const char* k) {
    auto it = env.find(k);
    return it == env.end() ? std::string() : it->second;
  };
  id.pod_name = get("POD_NAME");
  id.pod_namespace = get("POD_NAMESPACE");
  // A pod's hostname is its name unless the spec sets another: used only inside Kubernetes.
  if (id.pod_name.empty() && !get("KUBERNETES_SERVICE_HOST").empty()) id.pod_name = get("HOSTNAME");
  if (id.pod_uid.empty()) id.pod_uid = get("POD_UID");
}

}  // namespace strata::agent
