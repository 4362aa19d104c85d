/* Expanded (not compiled) by build.rs: says which fast-path options this DPDK was built with.
 * Each marker that survives the preprocessor is one option that is on. */
#include <rte_config.h>
#ifdef RTE_ETHDEV_RXTX_CALLBACKS
portico_probe_rxtx_callbacks
#endif
#ifdef RTE_ETHDEV_DEBUG_RX
portico_probe_debug_rx
#endif
#ifdef RTE_ETHDEV_DEBUG_TX
portico_probe_debug_tx
#endif
#ifdef RTE_ENABLE_TRACE_FP
portico_probe_trace_fp
#endif
