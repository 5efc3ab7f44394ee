// Payloads sent by reference, and taking them back in.
//
// On a port whose PMD copies every frame out of its mbufs within tx_burst
// (Port::tx_by_reference: memif in copy mode, af_packet, pcap), the send path
// (Interface) builds a data frame as two segments: a header mbuf holding the
// Ethernet, IPv4, UDP and Mercury headers, and a shell mbuf attached, as an
// external buffer, to the payload where it lies (a trainer's gradient, the
// server's parameters). The PMD then copies the payload once, straight from
// there, instead of after a first copy into an mbuf.
//
// That is only safe while tx_burst is the frame's last reader: the memory is
// the sender's, and once the transport has its acknowledgement, its owner may
// change or free it (a resent duplicate may still be on its way). So a frame
// that outlives the call that staged it (refused by the PMD and kept for the
// next flush, or held in the link emulator's delay line) first takes its
// payload in: copied into the header mbuf's own data room, the shell freed.
// The header mbuf comes from the port's pool, whose data room holds a whole
// frame, so there is always room.
//
// Nothing here allocates, throws, locks or logs.
#pragma once

#include <rte_mbuf.h>

#include <cstring>

namespace mercury::net {

/// `m` is a frame whose payload is still the sender's memory.
inline bool payload_by_reference(const rte_mbuf* m) {
  return m->next != nullptr && RTE_MBUF_HAS_EXTBUF(m->next);
}

/// Copies the payload of a frame sent by reference into its header mbuf and
/// frees the shell, so the frame no longer refers to the sender's memory.
/// Frames already whole are left as they are. False (the frame unchanged)
/// only if the header mbuf has no room, which a frame built by Interface
/// never lacks.
inline bool take_payload_in(rte_mbuf* m) {
  if (!payload_by_reference(m)) return true;
  rte_mbuf* shell = m->next;
  if (shell->next != nullptr || rte_pktmbuf_tailroom(m) < shell->data_len) return false;
  std::memcpy(rte_pktmbuf_mtod_offset(m, char*, m->data_len), rte_pktmbuf_mtod(shell, char*),
              shell->data_len);
  m->data_len = static_cast<uint16_t>(m->data_len + shell->data_len);
  m->next = nullptr;
  m->nb_segs = 1;
  rte_pktmbuf_free_seg(shell);
  return true;
}

}  // namespace mercury::net
