// Which pod and container a process runs in, for the records of a Kubernetes (or plain container)
// node: the pod UID and container id from the process's cgroup path (/proc/PID/cgroup, cgroup v1
// and v2, cgroupfs and systemd drivers; docker, containerd, CRI-O, podman), the pod's name and
// namespace from the environment the pod spec gives it (POD_NAME / POD_NAMESPACE through the
// downward API; HOSTNAME is the pod's name when KUBERNETES_SERVICE_HOST says it runs in one).
// Parsers take text, so tests need no cgroups.
#pragma once

#include <map>
#include <string>

namespace strata::agent {

struct ContainerIdentity {
  std::string pod_uid;        // 3f2a1b4c-..., dashed as the API server shows it
  std::string container_id;   // as Kubernetes' containerStatuses name it: containerd://<64 hex>,
                              // docker://..., cri-o://..., podman://...; the bare id when the
                              // runtime cannot be told from the path
  std::string pod_name;
  std::string pod_namespace;
};

// From /proc/PID/cgroup text: pod_uid and container_id (the others stay empty).
ContainerIdentity parse_cgroup_identity(const std::string& proc_cgroup);

// Adds the pod name and namespace from a process's environment (and its pod UID when the cgroup
// path had none: POD_UID through the downward API).
void add_env_identity(const std::map<std::string, std::string>& env, ContainerIdentity& id);

}  // namespace strata::agent
