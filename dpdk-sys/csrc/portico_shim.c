#include "portico_shim.h"

int portico_errno(void) { return rte_errno; }
unsigned portico_lcore_id(void) { return rte_lcore_id(); }
uint64_t portico_rdtsc(void) { return rte_rdtsc(); }

uint16_t portico_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port_id, queue_id, pkts, n);
}

uint16_t portico_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port_id, queue_id, pkts, n);
}

struct rte_mbuf *portico_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

int portico_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void portico_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
char *portico_pktmbuf_append(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_append(m, len); }
int portico_pktmbuf_trim(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_trim(m, len); }
void portico_pktmbuf_reset(struct rte_mbuf *m) { rte_pktmbuf_reset(m); }

unsigned portico_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned n)
{
	return rte_ring_enqueue_burst(r, objs, n, NULL);
}

unsigned portico_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n)
{
	return rte_ring_dequeue_burst(r, objs, n, NULL);
}

unsigned portico_ring_count(const struct rte_ring *r) { return rte_ring_count(r); }
