// Lets memif_goodput_bench open a net_memif port at MTU 9000 on DPDK 22.11.
//
// Why. memif in 22.11 announces max_rx_pktlen 1518 whatever its bsize, so
// rte_eth_dev_configure refuses any MTU above 1500 ("Frame size (9018) >
// device max frame size (1518)"), although its datapath carries any length
// (benchmarks/net/README.md, "net_memif, two processes"). memif_rate_bench
// configures its port at 1500 and sends 9014-byte frames anyway; the
// transport endpoint cannot do that, because it carves packets from the
// port's MTU (Endpoint::max_payload, from net::Port::mtu()). Neither lib/net
// nor lib/transport has a way to say "the datapath carries more than the PMD
// announces", so this file, linked into the benchmark alone, interposes
// rte_eth_dev_info_get: for a net_memif port it raises max_rx_pktlen to one
// memif slot (kSlotBytes, which the vdev's bsize makes every frame fit), so
// ethdev accepts MTU 9000 (9018-byte frames <= 9024). Every other field, and
// every other driver, is what DPDK answered.
//
// How. The executable exports this definition (export_dynamic in meson), and
// librte_ethdev calls rte_eth_dev_info_get through its PLT (also from
// rte_eth_dev_configure), so the dynamic linker binds those calls here; the
// real function is found with dlvsym(RTLD_NEXT, ..., "DPDK_23"). If it is not
// found (another DPDK ABI) the call fails with -ENOSYS, and Port::open says so.
#include <dlfcn.h>
#include <rte_ethdev.h>

#include <cerrno>
#include <cstring>

#include "memif_bench.h"

extern "C" int rte_eth_dev_info_get(uint16_t port_id, struct rte_eth_dev_info* dev_info) {
  using InfoGet = int (*)(uint16_t, rte_eth_dev_info*);
  static const auto real =
      reinterpret_cast<InfoGet>(dlvsym(RTLD_NEXT, "rte_eth_dev_info_get", "DPDK_23"));
  if (real == nullptr) return -ENOSYS;
  const int rc = real(port_id, dev_info);
  if (rc == 0 && dev_info->driver_name != nullptr &&
      std::strcmp(dev_info->driver_name, "net_memif") == 0 &&
      dev_info->max_rx_pktlen < mercury::bench::memif::kSlotBytes) {
    dev_info->max_rx_pktlen = mercury::bench::memif::kSlotBytes;
  }
  return rc;
}
