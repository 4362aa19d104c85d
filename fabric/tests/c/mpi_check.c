/* An MPI program with every byte checked, run by Open MPI over the Portico provider
 * (fabric/tests/mpi.rs): tagged ping-pong between ranks 0 and 1 from 1 B to 1 MiB (eager and
 * rendezvous), receives from MPI_ANY_SOURCE and with MPI_ANY_TAG, messages that arrive before
 * their receive is posted (unexpected), probes (MPI_Iprobe, MPI_Probe, MPI_Mprobe and
 * MPI_Improbe with MPI_Mrecv: libfabric's FI_PEEK and FI_CLAIM), a barrier and an allreduce. Plain MPI, nothing of
 * Portico's. Prints one line and exits 0 when every check holds; aborts with a line naming
 * the check otherwise. `mpi_check pingpong SIZE ITERS` is the timed ping-pong of
 * bench/libfabric.sh instead.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

#define FAIL(...)                                              \
	do {                                                   \
		fprintf(stderr, "mpi_check rank %d: ", rank);  \
		fprintf(stderr, __VA_ARGS__);                  \
		fprintf(stderr, "\n");                         \
		MPI_Abort(MPI_COMM_WORLD, 1);                  \
	} while (0)

static uint8_t byte(size_t i, int seed) { return (uint8_t)(i * 31 + seed * 7 + (i >> 11)); }

static void fill(uint8_t *b, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = byte(i, seed);
}

static void check(const uint8_t *b, size_t n, int seed, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != byte(i, seed))
			FAIL("%s: byte %zu of %zu is %#x, expected %#x", what, i, n, b[i], byte(i, seed));
}

/* `mpi_check pingpong SIZE ITERS`: the timed MPI ping-pong of bench/libfabric.sh between ranks
 * 0 and 1 (a tenth of ITERS first, untimed), the last message of each direction checked. */
static int pingpong(size_t n, int iters)
{
	uint8_t *ping = malloc(n ? n : 1), *pong = malloc(n ? n : 1);
	fill(ping, n, 1);
	fill(pong, n, 2);
	int warm = iters / 10;
	double t0 = 0;
	for (int it = -warm; it < iters; it++) {
		if (it == 0) {
			MPI_Barrier(MPI_COMM_WORLD);
			t0 = MPI_Wtime();
		}
		if (rank == 0) {
			MPI_Send(ping, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
			MPI_Recv(pong, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(ping, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(pong, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
		}
	}
	double one_way = (MPI_Wtime() - t0) / iters / 2;
	check(rank == 0 ? pong : ping, n, rank == 0 ? 2 : 1, "pingpong");
	if (rank == 0)
		printf("pingpong %zu bytes %d iters: %.3f us one-way, %.1f MB/s\n", n, iters,
		       one_way * 1e6, n / one_way / 1e6);
	free(ping);
	free(pong);
	MPI_Finalize();
	return 0;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size < 2)
		FAIL("needs at least 2 ranks");
	if (argc == 4 && !strcmp(argv[1], "pingpong"))
		return pingpong((size_t)atol(argv[2]), atoi(argv[3]));
	const size_t max = 1 << 20;
	uint8_t *buf = malloc(max), *out = malloc(max);
	MPI_Status st;
	int count;

	/* 1. Ping-pong between ranks 0 and 1, every size doubling from 1 B to 1 MiB. */
	int rounds = 0;
	for (size_t n = 1; n <= max; n *= 4) {
		for (int it = 0; it < 3; it++) {
			int seed = (int)(n + it);
			if (rank == 0) {
				fill(out, n, seed);
				MPI_Send(out, (int)n, MPI_BYTE, 1, 100 + it, MPI_COMM_WORLD);
				memset(buf, 0, n);
				MPI_Recv(buf, (int)n, MPI_BYTE, 1, 200 + it, MPI_COMM_WORLD, &st);
				MPI_Get_count(&st, MPI_BYTE, &count);
				if ((size_t)count != n)
					FAIL("pong of %zu bytes came with %d", n, count);
				check(buf, n, seed + 1, "pong");
			} else if (rank == 1) {
				memset(buf, 0, n);
				MPI_Recv(buf, (int)n, MPI_BYTE, 0, 100 + it, MPI_COMM_WORLD, &st);
				check(buf, n, seed, "ping");
				fill(out, n, seed + 1);
				MPI_Send(out, (int)n, MPI_BYTE, 0, 200 + it, MPI_COMM_WORLD);
			}
			rounds++;
		}
	}

	/* 2. Every rank sends to rank 0, which takes them from MPI_ANY_SOURCE, MPI_ANY_TAG:
	 * the source and tag come from the status, the bytes from the sender's seed. */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		int seen = 0;
		for (int k = 1; k < size; k++) {
			memset(buf, 0, 5000);
			MPI_Recv(buf, 5000, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
			MPI_Get_count(&st, MPI_BYTE, &count);
			if (st.MPI_TAG != 7000 + st.MPI_SOURCE || count != 1000 * st.MPI_SOURCE)
				FAIL("any-source: tag %d, %d bytes from %d", st.MPI_TAG, count, st.MPI_SOURCE);
			check(buf, (size_t)count, 9000 + st.MPI_SOURCE, "any-source");
			seen |= 1 << st.MPI_SOURCE;
		}
		if (seen != ((1 << size) - 2))
			FAIL("any-source: sources seen %#x", seen);
	} else {
		fill(out, 1000 * (size_t)rank, 9000 + rank);
		MPI_Send(out, 1000 * rank, MPI_BYTE, 0, 7000 + rank, MPI_COMM_WORLD);
	}

	/* 3. Unexpected messages: rank 1 sends three tags before rank 0 posts any receive; rank
	 * 0 receives them in the reverse tag order (matching, not arrival, decides). The barrier
	 * first: rank 0's any-source receives above must not take these. */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 1) {
		for (int t = 0; t < 3; t++) {
			fill(out, 3000 + t, 500 + t);
			MPI_Send(out, 3000 + t, MPI_BYTE, 0, 500 + t, MPI_COMM_WORLD);
		}
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		for (int t = 2; t >= 0; t--) {
			memset(buf, 0, 4000);
			MPI_Recv(buf, 4000, MPI_BYTE, 1, 500 + t, MPI_COMM_WORLD, &st);
			MPI_Get_count(&st, MPI_BYTE, &count);
			if (count != 3000 + t)
				FAIL("unexpected tag %d: %d bytes", 500 + t, count);
			check(buf, (size_t)count, 500 + t, "unexpected");
		}
	}

	/* 4. Probes. Rank 1 sends tags 600 (100 B), 601 (40 000 B: rendezvous) and 602 (3000 B)
	 * before rank 0 looks; rank 0 finds nothing under tag 603, then learns each message's
	 * size from a probe before it receives it: MPI_Probe then MPI_Recv, MPI_Mprobe then
	 * MPI_Mrecv (the message claimed, rendezvous and all), MPI_Improbe then MPI_Mrecv. */
	MPI_Barrier(MPI_COMM_WORLD);
	const int psize[3] = {100, 40000, 3000};
	if (rank == 1) {
		MPI_Request req[3];
		for (int t = 0; t < 3; t++) {
			fill(out + 50000 * t, (size_t)psize[t], 600 + t);
			MPI_Isend(out + 50000 * t, psize[t], MPI_BYTE, 0, 600 + t, MPI_COMM_WORLD, &req[t]);
		}
		MPI_Waitall(3, req, MPI_STATUSES_IGNORE);
	} else if (rank == 0) {
		int flag = 1;
		MPI_Iprobe(MPI_ANY_SOURCE, 603, MPI_COMM_WORLD, &flag, &st);
		if (flag)
			FAIL("probe: MPI_Iprobe found a message under tag 603, which nobody sent");
		MPI_Probe(1, 602, MPI_COMM_WORLD, &st);
		MPI_Get_count(&st, MPI_BYTE, &count);
		if (count != psize[2] || st.MPI_SOURCE != 1 || st.MPI_TAG != 602)
			FAIL("probe: MPI_Probe(602) says %d bytes from %d tag %d", count, st.MPI_SOURCE,
			     st.MPI_TAG);
		memset(buf, 0, (size_t)count);
		MPI_Recv(buf, count, MPI_BYTE, 1, 602, MPI_COMM_WORLD, &st);
		check(buf, (size_t)count, 602, "probe then receive");
		MPI_Message m;
		MPI_Mprobe(1, 601, MPI_COMM_WORLD, &m, &st);
		MPI_Get_count(&st, MPI_BYTE, &count);
		if (count != psize[1])
			FAIL("probe: MPI_Mprobe(601) says %d bytes", count);
		memset(buf, 0, (size_t)count);
		MPI_Mrecv(buf, count, MPI_BYTE, &m, &st);
		check(buf, (size_t)count, 601, "mprobe then mrecv (rendezvous)");
		flag = 0;
		for (int i = 0; !flag; i++) {
			if (i > 10000000)
				FAIL("probe: MPI_Improbe(600) never found the message");
			MPI_Improbe(1, 600, MPI_COMM_WORLD, &flag, &m, &st);
		}
		MPI_Get_count(&st, MPI_BYTE, &count);
		if (count != psize[0])
			FAIL("probe: MPI_Improbe(600) says %d bytes", count);
		memset(buf, 0, (size_t)count);
		MPI_Mrecv(buf, count, MPI_BYTE, &m, &st);
		check(buf, (size_t)count, 600, "improbe then mrecv");
		MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
		if (flag)
			FAIL("probe: a message is left after all three were received (tag %d)", st.MPI_TAG);
	}

	/* 5. Allreduce of 10 000 integers: every element's sum is known. */
	int n = 10000;
	int *v = malloc(n * sizeof(int)), *sum = malloc(n * sizeof(int));
	for (int i = 0; i < n; i++)
		v[i] = i * (rank + 1);
	MPI_Allreduce(v, sum, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	long factor = (long)size * (size + 1) / 2;
	for (int i = 0; i < n; i++)
		if (sum[i] != (int)(i * factor))
			FAIL("allreduce: element %d is %d, expected %ld", i, sum[i], i * factor);

	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: %d ranks, %d ping-pong rounds to 1 MiB, any-source, unexpected, "
		       "probes, allreduce: every byte checked\n",
		       size, rounds);
	free(v);
	free(sum);
	free(buf);
	free(out);
	MPI_Finalize();
	return 0;
}
