/* The DPDK headers Portico binds, plus out-of-line wrappers for the static inline functions
 * and macros the engine calls. Every wrapper is a one-liner: no logic lives here. */
#ifndef PORTICO_SHIM_H
#define PORTICO_SHIM_H

#include <rte_config.h>
#include <rte_version.h>
#include <rte_errno.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_ring.h>
#include <rte_ethdev.h>
#include <rte_eth_ring.h>
#include <rte_telemetry.h>
#include <rte_cpuflags.h>

/* rte_errno is a per-lcore thread-local variable. */
int portico_errno(void);
unsigned portico_lcore_id(void);
uint64_t portico_rdtsc(void);

uint16_t portico_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t n);
uint16_t portico_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t n);

struct rte_mbuf *portico_pktmbuf_alloc(struct rte_mempool *mp);
int portico_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count);
void portico_pktmbuf_free(struct rte_mbuf *m);
char *portico_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
int portico_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
void portico_pktmbuf_reset(struct rte_mbuf *m);

unsigned portico_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned n);
unsigned portico_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n);
unsigned portico_ring_count(const struct rte_ring *r);

#endif
