/* fi_write, fi_read, fi_inject_write, fi_writedata, fi_inject_writedata and a
 * FI_COMMIT_COMPLETE fi_writemsg over the Portico provider between two processes, every byte
 * checked on both sides; and a READ outside the target's region, which must come back as an
 * error completion (the target's NAK), touching nothing.
 *
 *   rma_check server DIR     maps DIR/region.bin (256 KiB, MAP_SHARED) and registers it,
 *                            writes DIR/server (its address, the region's address and key),
 *                            reads its CQ (the remote CQ data) until DIR/done, checks the
 *                            region and the file
 *   rma_check client DIR     reads DIR/server, writes, reads back, injects, writes with data,
 *                            writes with FI_COMMIT_COMPLETE, reads out of bounds, cancels
 *                            a receive and closes its endpoint with one posted
 *
 * The client asks for tclass FI_TC_BULK_DATA (the test gives it a shaper with such a class)
 * and waits for its completions in fi_cq_sread; the server's CQ has an FI_WAIT_FD descriptor
 * that it polls after fi_trywait.
 *
 * Built by fabric/tests/programs.rs with `cc rma_check.c -lfabric`; plain libfabric calls,
 * nothing of Portico's. Exits 0 when every check holds, 1 (with a line on stderr) otherwise.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEN (256 * 1024)
#define CHECK(x)                                                                         \
	do {                                                                             \
		long rc_ = (long)(x);                                                    \
		if (rc_ < 0) {                                                           \
			fprintf(stderr, "%s:%d: %s = %ld (%s)\n", __FILE__, __LINE__, #x, \
				rc_, fi_strerror((int)-rc_));                            \
			exit(1);                                                         \
		}                                                                        \
	} while (0)
#define FAIL(...)                                     \
	do {                                          \
		fprintf(stderr, __VA_ARGS__);         \
		fprintf(stderr, "\n");                \
		exit(1);                              \
	} while (0)

static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_ep *ep;
static struct fid_cq *cq;
static struct fid_av *av;
static int wait_fd = -1;

static void open_all(int with_fd)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_RMA | FI_MSG | FI_RMA_PMEM;
	hints->tx_attr->tclass = FI_TC_BULK_DATA;
	hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED;
	hints->fabric_attr->prov_name = strdup("portico");
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA,
				     .wait_obj = with_fd ? FI_WAIT_FD : FI_WAIT_UNSPEC};
	CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	if (with_fd)
		CHECK(fi_control(&cq->fid, FI_GETWAIT, &wait_fd));
	struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
	CHECK(fi_av_open(domain, &av_attr, &av, NULL));
	CHECK(fi_endpoint(domain, info, &ep, NULL));
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_enable(ep));
	fi_freeinfo(hints);
	fi_freeinfo(info);
}

/* Waits for one completion of `ctx`; returns 0, or the error entry's err. */
static int wait_one(void *ctx)
{
	struct fi_cq_data_entry e;
	for (int i = 0; i < 6; i++) {
		/* Asleep until the engine publishes a completion (10 s at most). */
		ssize_t n = fi_cq_sread(cq, &e, 1, NULL, 10000);
		if (n == 1) {
			if (e.op_context != ctx)
				FAIL("completion of %p, expected %p", e.op_context, ctx);
			return 0;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			CHECK(fi_cq_readerr(cq, &err, 0));
			if (err.op_context != ctx)
				FAIL("error completion of %p, expected %p", err.op_context, ctx);
			return err.err;
		}
		if (n != -FI_EAGAIN)
			CHECK(n);
	}
	FAIL("no completion for %p", ctx);
}

static uint8_t pattern(size_t i) { return (uint8_t)(i * 7 + (i >> 9) + 3); }

/* The two messages the client sends from several iovecs (offsets into its pattern, lengths):
 * 5 000 bytes go eagerly, 40 000 by rendezvous (gathered by the provider first). */
static const size_t piece_at[2][3] = {{0, 3000, 9000}, {0, 20000, 60000}};
static const size_t piece_len[2][3] = {{1000, 1500, 2500}, {10000, 20000, 10000}};

/* Whether `b` holds message `m`'s pieces one after the other. */
static int holds_message(const uint8_t *b, int m)
{
	size_t k = 0;
	for (int p = 0; p < 3; p++)
		for (size_t i = 0; i < piece_len[m][p]; i++)
			if (b[k++] != pattern(piece_at[m][p] + i))
				return 0;
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		FAIL("usage: rma_check server|client DIR");
	char path[4096];
	open_all(!strcmp(argv[1], "server"));
	if (!strcmp(argv[1], "server")) {
		/* A file the target maps: the target of durable WRITEs (msync). */
		snprintf(path, sizeof(path), "%s/region.bin", argv[2]);
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || ftruncate(fd, LEN))
			FAIL("server: cannot make %s", path);
		uint8_t *region = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (region == MAP_FAILED)
			FAIL("server: cannot map %s", path);
		struct fid_mr *mr;
		CHECK(fi_mr_reg(domain, region, LEN, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL));
		/* Two receives for the client's messages of several iovecs, posted before it sends. */
		static uint8_t rbuf[2][65536];
		int rctx[2];
		for (int m = 0; m < 2; m++)
			CHECK(fi_recv(ep, rbuf[m], sizeof(rbuf[m]), NULL, FI_ADDR_UNSPEC, &rctx[m]));
		uint8_t name[64];
		size_t len = sizeof(name);
		CHECK(fi_getname(&ep->fid, name, &len));
		snprintf(path, sizeof(path), "%s/server.tmp", argv[2]);
		FILE *f = fopen(path, "w");
		fwrite(&len, sizeof(len), 1, f);
		fwrite(name, 1, len, f);
		uint64_t addr = (uintptr_t)region, key = fi_mr_key(mr);
		fwrite(&addr, 8, 1, f);
		fwrite(&key, 8, 1, f);
		fclose(f);
		char done[4096];
		snprintf(done, sizeof(done), "%s/server", argv[2]);
		rename(path, done);
		snprintf(path, sizeof(path), "%s/done", argv[2]);
		/* The client's fi_writedata and fi_inject_writedata: their data in this CQ, in
		 * order, with no receive posted by us. */
		uint64_t want_data[2] = {0xc0ffee01, 0xc0ffee02};
		size_t want_len[2] = {4096, 64};
		int seen = 0, woken = 0, msgs = 0;
		struct fid *fids[1] = {&cq->fid};
		for (int i = 0; access(path, F_OK) != 0 || seen < 2 || msgs < 2; i++) {
			if (i > 6000)
				FAIL("server: the client never finished (%d remote CQ data, %d messages)",
				     seen, msgs);
			struct fi_cq_data_entry e;
			ssize_t n = fi_cq_read(cq, &e, 1);
			if (n == 1 && (e.flags & FI_RECV)) {
				size_t want = piece_len[msgs][0] + piece_len[msgs][1] + piece_len[msgs][2];
				if (msgs >= 2 || e.op_context != &rctx[msgs] || e.len != want ||
				    !holds_message(rbuf[msgs], msgs))
					FAIL("server: message %d: %zu bytes, expected %zu, or other bytes", msgs,
					     e.len, want);
				msgs++;
				continue;
			}
			if (n == 1) {
				uint64_t want = FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA;
				if (seen >= 2 || e.flags != want || e.data != want_data[seen] ||
				    e.len != want_len[seen])
					FAIL("server: completion %d: flags %#lx data %#lx len %zu", seen,
					     (unsigned long)e.flags, (unsigned long)e.data, e.len);
				seen++;
				continue;
			} else if (n != -FI_EAGAIN) {
				CHECK(n);
			}
			/* Block on the CQ's descriptor, as an event loop would (100 ms at most, to
			 * look for DIR/done). */
			if (fi_trywait(fabric, fids, 1) == 0) {
				struct pollfd p = {.fd = wait_fd, .events = POLLIN};
				if (poll(&p, 1, 100) > 0)
					woken++;
			}
		}
		if (woken == 0)
			FAIL("server: the FI_WAIT_FD descriptor never became readable");
		for (size_t i = 0; i < LEN; i++) {
			uint8_t want = i < 1024 ? (uint8_t)(0xa0 + i % 16) : pattern(i);
			if (region[i] != want)
				FAIL("server: byte %zu is %#x, expected %#x", i, region[i], want);
		}
		/* What the file holds (read through the file, not the mapping). */
		uint8_t *file = malloc(LEN);
		if (pread(fd, file, LEN, 0) != LEN || memcmp(file, region, LEN))
			FAIL("server: the file does not hold what the region does");
		CHECK(fi_close(&mr->fid));
		printf("server: %d bytes as written, 2 remote CQ data received in order, 2 messages "
		       "of 3 iovecs, woken by the wait descriptor\n",
		       LEN);
		return 0;
	}
	snprintf(path, sizeof(path), "%s/server", argv[2]);
	FILE *f = NULL;
	for (int i = 0; !(f = fopen(path, "r")); i++) {
		if (i > 6000)
			FAIL("client: no %s", path);
		usleep(10000);
	}
	size_t len;
	uint8_t name[64];
	uint64_t raddr, rkey;
	if (fread(&len, sizeof(len), 1, f) != 1 || len > sizeof(name) || fread(name, 1, len, f) != len ||
	    fread(&raddr, 8, 1, f) != 1 || fread(&rkey, 8, 1, f) != 1)
		FAIL("client: bad %s", path);
	fclose(f);
	fi_addr_t peer;
	if (fi_av_insert(av, name, 1, &peer, 0, NULL) != 1)
		FAIL("client: fi_av_insert");
	uint8_t *src = aligned_alloc(4096, LEN), *back = aligned_alloc(4096, LEN);
	for (size_t i = 0; i < LEN; i++)
		src[i] = pattern(i);
	memset(back, 0, LEN);
	struct fid_mr *smr, *bmr;
	CHECK(fi_mr_reg(domain, src, LEN, FI_WRITE, 0, 0, 0, &smr, NULL));
	CHECK(fi_mr_reg(domain, back, LEN, FI_READ, 0, 0, 0, &bmr, NULL));
	int ctx[4];
	ssize_t rc;
	/* The first operation connects: -FI_EAGAIN until the connection is up. */
	while ((rc = fi_write(ep, src, LEN, fi_mr_desc(smr), peer, raddr, rkey, &ctx[0])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[0]))
		FAIL("client: fi_write failed");
	while ((rc = fi_read(ep, back, LEN, fi_mr_desc(bmr), peer, raddr, rkey, &ctx[1])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[1]))
		FAIL("client: fi_read failed");
	if (memcmp(src, back, LEN))
		FAIL("client: the READ brought back other bytes than the WRITE put");
	/* fi_inject_write: the buffer is ours again on return (overwritten at once). */
	uint8_t small[1024];
	for (int i = 0; i < 1024; i++)
		small[i] = (uint8_t)(0xa0 + i % 16);
	for (int at = 0; at < 1024; at += 256) {
		while ((rc = fi_inject_write(ep, small + at, 256, peer, raddr + at, rkey)) == -FI_EAGAIN)
			usleep(100);
		CHECK(rc);
		memset(small + at, 0xee, 256);
	}
	/* Read the injected bytes back, with no descriptor (any local buffer is valid). */
	uint8_t check[1024];
	while ((rc = fi_read(ep, check, 1024, NULL, peer, raddr, rkey, &ctx[2])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[2]))
		FAIL("client: fi_read of the injected bytes failed");
	for (int i = 0; i < 1024; i++)
		if (check[i] != (uint8_t)(0xa0 + i % 16))
			FAIL("client: injected byte %d is %#x", i, check[i]);
	/* fi_writedata: the target's CQ gets the data (FI_REMOTE_CQ_DATA), here a completion. */
	while ((rc = fi_writedata(ep, src + 8192, 4096, fi_mr_desc(smr), 0xc0ffee01, peer,
				  raddr + 8192, rkey, &ctx[0])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[0]))
		FAIL("client: fi_writedata failed");
	while ((rc = fi_inject_writedata(ep, src + 16384, 64, 0xc0ffee02, peer, raddr + 16384,
					 rkey)) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	/* Messages of three iovecs each: gathered by the engine (5 000 bytes, eager), and into a
	 * bounce buffer for the rendezvous (40 000 bytes). */
	for (int m = 0; m < 2; m++) {
		struct iovec v[3];
		for (int p = 0; p < 3; p++)
			v[p] = (struct iovec){.iov_base = src + piece_at[m][p], .iov_len = piece_len[m][p]};
		while ((rc = fi_sendv(ep, v, NULL, 3, peer, &ctx[2])) == -FI_EAGAIN)
			usleep(100);
		CHECK(rc);
		if (wait_one(&ctx[2]))
			FAIL("client: fi_sendv of message %d failed", m);
	}
	/* fi_writev gathers three pieces into one remote range (zeroed first), fi_readv scatters
	 * it back into three: every byte where it belongs. */
	static uint8_t zero[3000], tmp[12000], got[12000];
	for (int i = 0; i < 3000; i++)
		tmp[(i / 1000) * 5000 + i % 1000] = pattern(200000 + i);
	while ((rc = fi_write(ep, zero, 3000, NULL, peer, raddr + 200000, rkey, &ctx[0])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[0]))
		FAIL("client: zeroing failed");
	struct iovec wv[3] = {{tmp, 1000}, {tmp + 5000, 1000}, {tmp + 10000, 1000}};
	while ((rc = fi_writev(ep, wv, NULL, 3, peer, raddr + 200000, rkey, &ctx[0])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[0]))
		FAIL("client: fi_writev failed");
	struct iovec rv[3] = {{got + 7000, 1000}, {got, 1500}, {got + 3000, 500}};
	while ((rc = fi_readv(ep, rv, NULL, 3, peer, raddr + 200000, rkey, &ctx[0])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[0]))
		FAIL("client: fi_readv failed");
	for (int i = 0; i < 3000; i++) {
		uint8_t b = i < 1000 ? got[7000 + i] : i < 2500 ? got[i - 1000] : got[3000 + i - 2500];
		if (b != pattern(200000 + i))
			FAIL("client: byte %d of the gathered write, scattered back, is %#x", i, b);
	}
	/* A value the 4-byte CQ data cannot carry is refused. */
	rc = fi_writedata(ep, src, 8, NULL, 1ull << 32, peer, raddr, rkey, &ctx[0]);
	if (rc != -FI_EINVAL)
		FAIL("client: fi_writedata of 33-bit data gave %zd, expected -FI_EINVAL", rc);
	/* FI_COMMIT_COMPLETE (FI_RMA_PMEM): a durable WRITE, complete when the target says the
	 * bytes are durable (it msyncs its file). */
	struct iovec iov = {.iov_base = src + 65536, .iov_len = 65536};
	void *desc = fi_mr_desc(smr);
	struct fi_rma_iov riov = {.addr = raddr + 65536, .len = 65536, .key = rkey};
	struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = peer,
				 .rma_iov = &riov, .rma_iov_count = 1, .context = &ctx[1]};
	while ((rc = fi_writemsg(ep, &msg, FI_COMMIT_COMPLETE | FI_COMPLETION)) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	if (wait_one(&ctx[1]))
		FAIL("client: the FI_COMMIT_COMPLETE write failed");
	/* Outside the region: refused by the target, an error completion here. */
	while ((rc = fi_read(ep, check, 64, NULL, peer, raddr + LEN, rkey, &ctx[3])) == -FI_EAGAIN)
		usleep(100);
	CHECK(rc);
	int e = wait_one(&ctx[3]);
	if (e != FI_EACCES)
		FAIL("client: a READ past the region gave err %d, expected FI_EACCES", e);
	CHECK(fi_close(&smr->fid));
	CHECK(fi_close(&bmr->fid));
	/* fi_cancel: a receive nobody sends to completes with FI_ECANCELED, once. */
	static char rbuf[2][64];
	int cctx[2];
	CHECK(fi_recv(ep, rbuf[0], 64, NULL, FI_ADDR_UNSPEC, &cctx[0]));
	CHECK(fi_cancel(&ep->fid, &cctx[0]));
	e = wait_one(&cctx[0]);
	if (e != FI_ECANCELED)
		FAIL("client: a cancelled receive gave err %d, expected FI_ECANCELED", e);
	rc = fi_cancel(&ep->fid, &cctx[0]);
	if (rc != -FI_ENOENT)
		FAIL("client: cancelling it again gave %zd, expected -FI_ENOENT", rc);
	/* Closing the endpoint unlinks the receives it still has: FI_ECANCELED too. */
	CHECK(fi_recv(ep, rbuf[1], 64, NULL, FI_ADDR_UNSPEC, &cctx[1]));
	CHECK(fi_close(&ep->fid));
	e = wait_one(&cctx[1]);
	if (e != FI_ECANCELED)
		FAIL("client: a receive of a closed endpoint gave err %d, expected FI_ECANCELED", e);
	snprintf(path, sizeof(path), "%s/done", argv[2]);
	fclose(fopen(path, "w"));
	printf("client: %d bytes written and read back, 1024 injected, 2 written with data, 65536 "
	       "committed, out-of-bounds READ refused, 2 receives cancelled, 3-iovec sends, "
	       "writev and readv\n",
	       LEN);
	return 0;
}
