// Pod and container identity from /proc/PID/cgroup lines as each runtime and cgroup driver writes
// them (cgroup v1 and v2; cgroupfs and systemd drivers; docker, containerd, CRI-O, podman), and
// from the pod's environment.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/container_identity.h"
#include "agent/process_info.h"

using strata::agent::add_env_identity;
using strata::agent::ContainerIdentity;
using strata::agent::parse_cgroup_identity;

namespace {

const std::string kUid = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b";
const std::string kUidSystemd = "3f2a1b4c_5d6e_4f70_8a9b_0c1d2e3f4a5b";
const std::string kId = "8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5";

TEST(ContainerIdentity, V2SystemdContainerd) {
  auto id = parse_cgroup_identity("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSystemd +
                                  ".slice/cri-containerd-" + kId + ".scope\n");
  EXPECT_EQ(id.pod_uid, kUid);
  EXPECT_EQ(id.container_id, "containerd://" + kId);
}

TEST(ContainerIdentity, V2SystemdCrio) {
  // Guaranteed QoS pods sit right under kubepods.slice.
  auto id = parse_cgroup_identity("0::/kubepods.slice/kubepods-pod" + kUidSystemd + ".slice/crio-" + kId + ".scope\n");
  EXPECT_EQ(id.pod_uid, kUid);
  EXPECT_EQ(id.container_id, "cri-o://" + kId);
}

TEST(ContainerIdentity, CrioConmonIsNoContainer) {
  auto id = parse_cgroup_identity("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" +
                                  kUidSystemd + ".slice/crio-conmon-" + kId + ".scope\n");
  EXPECT_EQ(id.pod_uid, kUid);
  EXPECT_EQ(id.container_id, "");
}

TEST(ContainerIdentity, V1SystemdDocker) {
  std::string path = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kUidSystemd +
                     ".slice/docker-" + kId + ".scope";
  auto id = parse_cgroup_identity("12:pids:" + path + "\n11:memory:" + path + "\n1:name=systemd:" + path + "\n0::/\n");
  EXPECT_EQ(id.pod_uid, kUid);
  EXPECT_EQ(id.container_id, "docker://" + kId);
}

TEST(ContainerIdentity, V1CgroupfsDriver) {
  // kubelet's cgroupfs driver: dashed UID, the container a bare id (runtime not in the path).
  std::string path = "/kubepods/burstable/pod" + kUid + "/" + kId;
  auto id = parse_cgroup_identity("11:cpu,cpuacct:" + path + "\n10:memory:" + path + "\n");
  EXPECT_EQ(id.pod_uid, kUid);
  EXPECT_EQ(id.container_id, kId);
}

TEST(ContainerIdentity, PlainDocker) {
  auto v1 = parse_cgroup_identity("4:memory:/docker/" + kId + "\n");
  EXPECT_EQ(v1.pod_uid, "");
  EXPECT_EQ(v1.container_id, "docker://" + kId);
  auto v2 = parse_cgroup_identity("0::/system.slice/docker-" + kId + ".scope\n");
  EXPECT_EQ(v2.container_id, "docker://" + kId);
  auto podman = parse_cgroup_identity("0::/machine.slice/libpod-" + kId + ".scope/container\n");
  EXPECT_EQ(podman.container_id, "podman://" + kId);
}

TEST(ContainerIdentity, NotAContainer) {
  for (const std::string& text :
       {std::string("0::/user.slice/user-1000.slice/session-3.scope\n"), std::string("0::/\n"),
        std::string("4:memory:/process_api/4f48b6b2a5f0b9d86b9c7d71af1ea038\n"), std::string(""),
        std::string("garbage"), std::string("0::/kubepods.slice/kubepods-podnot-a-uid.slice\n"),
        // a 64-hex-looking name that is one character short
        "0::/system.slice/docker-" + kId.substr(1) + ".scope\n"}) {
    auto id = parse_cgroup_identity(text);
    EXPECT_EQ(id.pod_uid, "") << text;
    EXPECT_EQ(id.container_id, "") << text;
  }
}

TEST(ContainerIdentity, Environment) {
  ContainerIdentity id;
  add_env_identity({{"POD_NAME", "trainer-0"}, {"POD_NAMESPACE", "ml"}, {"HOSTNAME", "other"}}, id);
  EXPECT_EQ(id.pod_name, "trainer-0");
  EXPECT_EQ(id.pod_namespace, "ml");

  // Inside Kubernetes without the downward API: the hostname is the pod's name.
  ContainerIdentity k8s;
  add_env_identity({{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}, {"HOSTNAME", "trainer-1"}, {"POD_UID", kUid}}, k8s);
  EXPECT_EQ(k8s.pod_name, "trainer-1");
  EXPECT_EQ(k8s.pod_uid, kUid);

  // Outside, a hostname is the machine's.
  ContainerIdentity host;
  add_env_identity({{"HOSTNAME", "box"}}, host);
  EXPECT_EQ(host.pod_name, "");

  // The cgroup path's UID wins over the environment's.
  ContainerIdentity both = parse_cgroup_identity("0::/kubepods/pod" + kUid + "/" + kId + "\n");
  add_env_identity({{"POD_UID", "something-else"}}, both);
  EXPECT_EQ(both.pod_uid, kUid);
}

// A neighbour is named as it is when the agent reads its window (agent/os/os_source.cpp): a process
// that renamed itself after its exec (prctl(PR_SET_NAME), as a hog or a worker pool does) by its new
// name; one that has gone by none (the kernel's name stands then).
TEST(ProcessComm, NamesAProcessAsItIsNow) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_NAME, "renamed-now", 0, 0, 0);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(strata::agent::process_comm(static_cast<uint32_t>(child)), "renamed-now");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(strata::agent::process_comm(static_cast<uint32_t>(child)), "");
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
