// A network of its own for the network-fault tests: a hub namespace with a
// bridge (10.78.0.1/24, where the store listens) and one namespace per rank
// (10.78.0.<rank + 2>, interface keel0) joined to it by a veth pair. Faults
// are injected in the namespaces only, so no traffic of the machine's own is
// touched, and everything is deleted when the lab goes out of scope (the
// processes inside are the World's, which kills them first).
//
// This kernel has no netem (CONFIG_NET_SCH_NETEM is not set: read from
// /proc/config.gz), so the faults are built from what it has:
//   slow links   tbf on both ends of every rank's veth: a link of a given
//                rate whose queue delays packets by up to `latency`, more
//                under load (a delay that varies: jitter);
//   packet loss  nftables in every rank's namespace: each packet in and out
//                dropped at random (numgen random) with the given chance;
//   partition    nftables drops everything in and out of one rank's
//                namespace; healing deletes the rule.
// Needs root, iproute2 and nftables (scripts/fetch-deps.sh installs them).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace keel::testing {

class NetLab {
 public:
  // Why the lab cannot be built here (empty when it can).
  static std::string unavailable() {
    if (::geteuid() != 0) return "network namespaces need root";
    if (std::system("command -v ip >/dev/null 2>&1 && command -v nft >/dev/null 2>&1 && "
                    "command -v tc >/dev/null 2>&1") != 0) {
      return "ip, tc or nft is missing (iproute2, nftables)";
    }
    return {};
  }

  explicit NetLab(int ranks) : ranks_(ranks), tag_(std::to_string(::getpid())) {
    ok_ = sh("ip netns add " + hub()) && sh(in(hub()) + "ip link set lo up") &&
          sh(in(hub()) + "ip link add br0 type bridge") &&
          sh(in(hub()) + "ip addr add 10.78.0.1/24 dev br0") &&
          sh(in(hub()) + "ip link set br0 up");
    for (int r = 0; ok_ && r < ranks_; ++r) {
      ok_ = sh("ip netns add " + ns(r)) && sh(in(ns(r)) + "ip link set lo up") &&
            sh("ip link add keel0 netns " + ns(r) + " type veth peer name " + hub_side(r) +
               " netns " + hub()) &&
            sh(in(ns(r)) + "ip addr add " + address(r) + "/24 dev keel0") &&
            sh(in(ns(r)) + "ip link set keel0 up") &&
            sh(in(hub()) + "ip link set " + hub_side(r) + " master br0 up") &&
            sh(in(ns(r)) + "nft add table inet keel") &&
            sh(in(ns(r)) + "nft add chain inet keel in '{ type filter hook input priority 0; }'") &&
            sh(in(ns(r)) + "nft add chain inet keel out '{ type filter hook output priority 0; }'");
    }
  }

  ~NetLab() {
    for (int r = 0; r < ranks_; ++r) sh("ip netns del " + ns(r) + " 2>/dev/null");
    sh("ip netns del " + hub() + " 2>/dev/null");
  }
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  bool ok() const { return ok_; }
  std::string hub() const { return "keelhub-" + tag_; }
  std::string ns(int rank) const { return "keelr" + std::to_string(rank) + "-" + tag_; }
  static std::string store_address() { return "10.78.0.1"; }

  // The prefix of rank `rank`'s command: inside its namespace, with gloo on
  // its interface.
  std::vector<std::string> launcher(int rank) const {
    return {"ip", "netns", "exec", ns(rank), "env", "GLOO_SOCKET_IFNAME=keel0"};
  }
  std::vector<std::string> hub_launcher() const { return {"ip", "netns", "exec", hub()}; }

  // Every rank's link at `mbit` Mbit/s, queueing up to `latency_ms`.
  bool slow_links(int mbit, int latency_ms) {
    const std::string tbf = " root tbf rate " + std::to_string(mbit) + "mbit burst 32kb latency " +
                            std::to_string(latency_ms) + "ms";
    bool all = true;
    for (int r = 0; r < ranks_; ++r) {
      all = all && sh(in(ns(r)) + "tc qdisc add dev keel0" + tbf) &&
            sh(in(hub()) + "tc qdisc add dev " + hub_side(r) + tbf);
    }
    return all;
  }

  // Each packet into and out of every rank dropped with chance percent/100.
  bool lossy(int percent) {
    bool all = true;
    for (int r = 0; r < ranks_; ++r) {
      for (const char* chain : {"in iifname", "out oifname"}) {
        all = all && sh(in(ns(r)) + "nft add rule inet keel " + chain +
                        " keel0 numgen random mod 100 '<' " + std::to_string(percent) + " drop");
      }
    }
    return all;
  }

  // Cuts rank `rank` off: nothing in or out of its namespace.
  bool partition(int rank) {
    return sh(in(ns(rank)) + "nft add rule inet keel in iifname keel0 drop") &&
           sh(in(ns(rank)) + "nft add rule inet keel out oifname keel0 drop");
  }
  // Joins it again.
  bool heal(int rank) {
    return sh(in(ns(rank)) + "nft flush chain inet keel in") &&
           sh(in(ns(rank)) + "nft flush chain inet keel out");
  }

 private:
  static bool sh(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  static std::string in(const std::string& ns) { return "ip netns exec " + ns + " "; }
  static std::string hub_side(int rank) { return "vr" + std::to_string(rank); }
  static std::string address(int rank) { return "10.78.0." + std::to_string(rank + 2); }

  int ranks_;
  std::string tag_;
  bool ok_ = false;
};

}  // namespace keel::testing
