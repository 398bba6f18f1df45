/*
 * The TCP backend of the communication interface (comm.h): the ranks of a
 * world spread over several processes, on host memory (CPU devices).
 *
 * The process holding rank 0 (the root) listens; every other process
 * connects to it and presents a hello: protocol version, the group token,
 * its ranks and the world's size.  The root refuses a hello with a reply
 * that says why (wrong token, ranks outside the world or already held) and
 * goes on waiting for the others; once every rank of the world is held
 * exactly once, it answers every member "go".
 *
 * A sum is a star: each member sends its ranks' values to the root in
 * chunks, the root adds all ranks' values in rank order (the same loop as
 * the shared-memory backend, so the same world gives the same floats) and
 * sends the one sum back.  A ring would move less data through the root,
 * but it adds each element in a different order on different ranks unless
 * it is made into a gather anyway; the replicas must stay bit-identical,
 * and CPU devices compute far slower than loopback or a LAN moves bytes.
 * Each chunk is a full round trip (members send, the root answers), so no
 * side ever writes while the other is also blocked writing.
 *
 * Every socket is non-blocking and every wait is a poll with a deadline, so
 * a dead or silent peer gives FB_ERR_IO naming its ranks instead of a hang.
 * When the root fails a sum it tells every member why before giving up, and
 * the stream is then broken for good: every later call fails at once.
 */
#include "comm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"

#define FB_COMM_MAX_WORLD 64
#define TCP_MAGIC 0x46425443u  /* "FBTC": hello and its reply */
#define SUM_MAGIC 0x46425352u  /* "FBSR": a chunk of a sum and its reply */
#define TCP_VERSION 1u
#define HELLO_BYTES (24 + FB_COMM_TOKEN_BYTES)
#define REPLY_BYTES 16
#define CHUNK_HDR_BYTES 32
#define REPLY_MSG_MAX 200
/* floats per rank in one round trip: big enough to hide the round trip's
 * latency, small enough that the root's buffers stay a few MiB */
#define CHUNK_FLOATS ((size_t)1 << 16)
#define TIMEOUT_MAX_MS 3600000

struct fb_comm_tcp_listener {
    int fd;
    int port;
};

typedef struct member {
    int fd;
    int base, n_local;
    float *buf; /* root: this member's ranks' chunk, [n_local][CHUNK_FLOATS] */
} member;

typedef struct tcp_ctx {
    int base, n_local, world, timeout_ms;
    bool root;
    int n_members;                     /* root: the other processes; else 1 (the root) */
    member members[FB_COMM_MAX_WORLD]; /* root: ordered by base */
    uint64_t seq;                      /* sums done so far, the same on every process */
    int broken;                        /* the fb_err that broke the stream; 0 while usable */
    char broken_msg[256];
    /* the rendezvous gives up once give_up(give_up_arg) says so (fb_comm_tcp_new_until) */
    bool (*give_up)(void *);
    void *give_up_arg;
} tcp_ctx;

/* How long a rendezvous waits at a time before it asks give_up again. */
#define GIVE_UP_POLL_MS 50

/* ---- plumbing ------------------------------------------------------------------ */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool gave_up(const tcp_ctx *x)
{
    return x->give_up && x->give_up(x->give_up_arg);
}

/* A rendezvous's next wait: what is left before deadline, in slices when it may give up. */
static int slice_ms(const tcp_ctx *x, int remaining)
{
    return x->give_up && remaining > GIVE_UP_POLL_MS ? GIVE_UP_POLL_MS : remaining;
}

static int remaining_ms(int64_t deadline)
{
    int64_t r = deadline - mono_ms();
    return r < 0 ? 0 : r > 0x7fffffff ? 0x7fffffff : (int)r;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_u64(unsigned char *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) << 32 | get_u32(p + 4);
}

/* "rank 3" or "ranks 1..2": how messages name a process. */
static const char *ranks_name(char *buf, size_t cap, int base, int n)
{
    if (n == 1)
        snprintf(buf, cap, "rank %d", base);
    else
        snprintf(buf, cap, "ranks %d..%d", base, base + n - 1);
    return buf;
}

/* Token comparison in constant time: how long it takes says nothing about
 * how much of a guess was right. */
static bool token_equal(const unsigned char *a, const unsigned char *b)
{
    unsigned char d = 0;
    for (int i = 0; i < FB_COMM_TOKEN_BYTES; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static int set_nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Result of io_read/io_write besides 0 (done). */
enum { IO_FAILED = -1, IO_PEER_SPOKE = 1 };

/*
 * Reads exactly len bytes before deadline.  Returns 0, or IO_FAILED with
 * why filled (closed, timed out, the system's reason).
 */
static int io_read(int fd, void *p, size_t len, int64_t deadline, char *why, size_t cap)
{
    unsigned char *b = p;
    while (len > 0) {
        ssize_t k = recv(fd, b, len, 0);
        if (k > 0) {
            b += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0) {
            snprintf(why, cap, "closed the connection");
            return IO_FAILED;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(why, cap, "broke the connection (%s)", strerror(errno));
            return IO_FAILED;
        }
        int wait = remaining_ms(deadline);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int rc = wait > 0 ? poll(&pf, 1, wait) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            snprintf(why, cap, "poll: %s", strerror(errno));
            return IO_FAILED;
        }
        if (rc == 0 && remaining_ms(deadline) == 0) {
            snprintf(why, cap, "sent nothing within the timeout");
            return IO_FAILED;
        }
    }
    return 0;
}

/*
 * Writes exactly len bytes before deadline.  With watch_in, stops early and
 * returns IO_PEER_SPOKE when the other side has something to say (the
 * root's error reply, which it sends without reading the rest of a chunk).
 * Returns 0 or IO_FAILED with why filled.
 */
static int io_write(int fd, const void *p, size_t len, int64_t deadline, bool watch_in, char *why,
                    size_t cap)
{
    const unsigned char *b = p;
    while (len > 0) {
        ssize_t k = send(fd, b, len, MSG_NOSIGNAL);
        if (k > 0) {
            b += k;
            len -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(why, cap, "%s", strerror(errno));
            return IO_FAILED;
        }
        int wait = remaining_ms(deadline);
        struct pollfd pf = {.fd = fd, .events = (short)(POLLOUT | (watch_in ? POLLIN : 0))};
        int rc = wait > 0 ? poll(&pf, 1, wait) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            snprintf(why, cap, "poll: %s", strerror(errno));
            return IO_FAILED;
        }
        if (rc == 0 && remaining_ms(deadline) == 0) {
            snprintf(why, cap, "took no data within the timeout");
            return IO_FAILED;
        }
        if (watch_in && (pf.revents & POLLIN)) return IO_PEER_SPOKE;
    }
    return 0;
}

/*
 * Splits "host:port" (or "[v6 address]:port") into its parts.  The port is
 * 0..65535 in decimal; an empty host is allowed where allow_empty_host (a
 * listener on every address).
 */
static int split_addr(const char *addr, bool allow_empty_host, char *host, size_t hcap, char *port,
                      size_t pcap, char *msg, size_t msg_cap)
{
    if (!addr) return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "no address (\"host:port\")");
    size_t len = strlen(addr);
    const char *colon = strrchr(addr, ':');
    const char *h = addr, *h_end = colon;
    if (len == 0 || len > 300 || !colon)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "address \"%.64s\" is not \"host:port\"",
                       addr);
    if (addr[0] == '[') {
        if (colon == addr || colon[-1] != ']')
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "address \"%.64s\" is not \"[host]:port\"", addr);
        h = addr + 1;
        h_end = colon - 1;
    } else if (memchr(addr, ':', (size_t)(colon - addr))) {
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "address \"%.64s\": an IPv6 host needs brackets, \"[host]:port\"", addr);
    }
    size_t hl = (size_t)(h_end - h), pl = strlen(colon + 1);
    if ((hl == 0 && !allow_empty_host) || hl >= hcap)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "address \"%.64s\" has no usable host",
                       addr);
    if (pl == 0 || pl > 5 || pl >= pcap || strspn(colon + 1, "0123456789") != pl ||
        atol(colon + 1) > 65535)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "address \"%.64s\": the port must be 0..65535", addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    memcpy(port, colon + 1, pl + 1);
    return FB_OK;
}

/* ---- the listener --------------------------------------------------------------- */

int fb_comm_tcp_listen(const char *addr, fb_comm_tcp_listener **out, int *port, char *msg,
                       size_t msg_cap)
{
    if (!out) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no output pointer");
    char host[256], serv[8];
    int err = split_addr(addr, true, host, sizeof host, serv, sizeof serv, msg, msg_cap);
    if (err) return err;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host[0] ? host : NULL, serv, &hints, &ai);
    if (rc != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot resolve \"%s\": %s", addr,
                       gai_strerror(rc));
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, FB_COMM_MAX_WORLD) != 0 ||
            set_nonblocking(fd) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot listen on \"%s\": %s", addr,
                       strerror(last_errno));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int bound = -1;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) bound = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        if (ss.ss_family == AF_INET6) bound = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    fb_comm_tcp_listener *l = malloc(sizeof *l);
    if (bound < 0 || !l) {
        close(fd);
        free(l);
        return fb_errf(msg, msg_cap, l ? FB_ERR_IO : FB_ERR_NOMEM,
                       l ? "cannot read the port bound for \"%s\"" : "out of memory", addr);
    }
    l->fd = fd;
    l->port = bound;
    if (port) *port = bound;
    *out = l;
    return FB_OK;
}

void fb_comm_tcp_listener_free(fb_comm_tcp_listener *l)
{
    if (!l) return;
    close(l->fd);
    free(l);
}

/* ---- the rendezvous ----------------------------------------------------------------- */

/* The hello a member sends: magic, version, world, base, n_local, a float in
 * the sender's own byte order (every process must read the others' floats
 * as its own), the token. */
static void hello_pack(unsigned char *h, int world, int base, int n_local,
                       const unsigned char *token)
{
    const float probe = -1.5f;
    put_u32(h, TCP_MAGIC);
    put_u32(h + 4, TCP_VERSION);
    put_u32(h + 8, (uint32_t)world);
    put_u32(h + 12, (uint32_t)base);
    put_u32(h + 16, (uint32_t)n_local);
    memcpy(h + 20, &probe, 4);
    memcpy(h + 24, token, FB_COMM_TOKEN_BYTES);
}

/* A reply: magic, status (0 or a negative fb_err), the length of the message that follows. */
static int reply_send(int fd, int status, const char *text, int timeout_ms)
{
    unsigned char r[REPLY_BYTES + REPLY_MSG_MAX];
    size_t tl = text ? strlen(text) : 0;
    if (tl > REPLY_MSG_MAX) tl = REPLY_MSG_MAX;
    put_u32(r, TCP_MAGIC);
    put_u32(r + 4, (uint32_t)status);
    put_u32(r + 8, (uint32_t)tl);
    put_u32(r + 12, 0);
    if (tl) memcpy(r + REPLY_BYTES, text, tl);
    char why[64];
    return io_write(fd, r, REPLY_BYTES + tl, mono_ms() + timeout_ms, false, why, sizeof why);
}

/* The only codes a refusal may carry; anything else received becomes FB_ERR_IO. */
static int known_refusal(int status)
{
    switch (status) {
    case FB_ERR_UNAUTHORIZED:
    case FB_ERR_ALREADY_EXISTS:
    case FB_ERR_OUT_OF_RANGE:
    case FB_ERR_UNSUPPORTED:
    case FB_ERR_IO:
        return status;
    default:
        return FB_ERR_IO;
    }
}

/*
 * The root's judgement of a hello.  Returns FB_OK with *base and *n filled,
 * or the refusal's code with why filled.  The token is checked before
 * anything else, so a stranger learns nothing about the group.
 */
static int hello_check(const tcp_ctx *x, const unsigned char *h, const unsigned char *token,
                       const signed char *holder, int *base, int *n, char *why, size_t cap)
{
    const float probe = -1.5f;
    if (get_u32(h) != TCP_MAGIC) return fb_errf(why, cap, FB_ERR_IO, "not a fusebox hello");
    if (get_u32(h + 4) != TCP_VERSION)
        return fb_errf(why, cap, FB_ERR_UNSUPPORTED, "protocol version %u, the root speaks %u",
                       get_u32(h + 4), TCP_VERSION);
    if (!token_equal(h + 24, token))
        return fb_errf(why, cap, FB_ERR_UNAUTHORIZED, "the group token does not match");
    if (memcmp(h + 20, &probe, 4) != 0)
        return fb_errf(why, cap, FB_ERR_UNSUPPORTED,
                       "floats in another byte order than the root's");
    uint32_t w = get_u32(h + 8), b = get_u32(h + 12), k = get_u32(h + 16);
    if (w != (uint32_t)x->world)
        return fb_errf(why, cap, FB_ERR_OUT_OF_RANGE, "a world of %u ranks, the root's has %d", w,
                       x->world);
    if (k < 1 || b >= w || k > w - b)
        return fb_errf(why, cap, FB_ERR_OUT_OF_RANGE,
                       "%u ranks from rank %u do not fit a world of %u", k, b, w);
    for (uint32_t r = b; r < b + k; r++)
        if (holder[r] >= 0) {
            char who[32];
            int hb = holder[r] == 0 ? 0 : x->members[holder[r] - 1].base;
            int hn = holder[r] == 0 ? x->n_local : x->members[holder[r] - 1].n_local;
            return fb_errf(why, cap, FB_ERR_ALREADY_EXISTS,
                           "rank %u is already held by the process of %s", r,
                           ranks_name(who, sizeof who, hb, hn));
        }
    *base = (int)b;
    *n = (int)k;
    return FB_OK;
}

typedef struct pending {
    int fd;
    size_t got;
    unsigned char h[HELLO_BYTES];
} pending;

/* The root: accepts hellos until every rank of the world is held, then says go. */
static int root_rendezvous(tcp_ctx *x, int lfd, const unsigned char *token, char *msg,
                           size_t msg_cap)
{
    signed char holder[FB_COMM_MAX_WORLD]; /* 0: the root; i > 0: members[i - 1]; -1: free */
    memset(holder, -1, sizeof holder);
    for (int r = 0; r < x->n_local; r++) holder[r] = 0;
    int held = x->n_local;
    enum { MAX_PENDING = 2 * FB_COMM_MAX_WORLD };
    pending pend[MAX_PENDING];
    int n_pend = 0;
    int64_t deadline = mono_ms() + x->timeout_ms;
    int err = FB_OK;
    while (held < x->world) {
        int wait = remaining_ms(deadline);
        if (wait == 0) {
            char missing[160] = "";
            size_t used = 0;
            for (int r = 0; r < x->world && used + 8 < sizeof missing; r++)
                if (holder[r] < 0)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                             used ? ", " : "", r);
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "ranks %s did not join within %d ms", missing,
                          x->timeout_ms);
            goto fail;
        }
        if (gave_up(x)) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "the rendezvous was called off");
            goto fail;
        }
        struct pollfd pf[1 + MAX_PENDING];
        pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < n_pend; i++)
            pf[1 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int rc = poll(pf, (nfds_t)(1 + n_pend), slice_ms(x, wait));
        if (rc < 0 && errno != EINTR) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "poll: %s", strerror(errno));
            goto fail;
        }
        if (rc <= 0) continue;
        /* the hellos first: accepting may reorder pend[] */
        for (int i = n_pend - 1; i >= 0; i--) {
            if (!(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            pending *p = &pend[i];
            ssize_t k = recv(p->fd, p->h + p->got, HELLO_BYTES - p->got, 0);
            if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            bool drop = k <= 0;
            if (k > 0) p->got += (size_t)k;
            if (!drop && p->got == HELLO_BYTES) {
                char why[200];
                int b = 0, n = 0;
                int st = hello_check(x, p->h, token, holder, &b, &n, why, sizeof why);
                if (st != FB_OK) {
                    /* the refused one hears why; the others are not disturbed */
                    reply_send(p->fd, st, why, 1000);
                    drop = true;
                } else {
                    int m = x->n_members++;
                    x->members[m] = (member){.fd = p->fd, .base = b, .n_local = n};
                    for (int r = b; r < b + n; r++) holder[r] = (signed char)(m + 1);
                    held += n;
                    pend[i] = pend[--n_pend];
                    continue;
                }
            }
            if (drop) {
                close(p->fd);
                pend[i] = pend[--n_pend];
            }
        }
        if (pf[0].revents & POLLIN) {
            for (;;) {
                int fd = accept(lfd, NULL, NULL);
                if (fd < 0) break;
                /* close-on-exec like every other socket here: a worker that
                 * starts a program must not hand it the group's connections */
                if (n_pend == MAX_PENDING || set_nonblocking(fd) != 0 ||
                    fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
                    close(fd);
                    continue;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                pend[n_pend++] = (pending){.fd = fd};
            }
        }
    }
    for (int i = 0; i < n_pend; i++) close(pend[i].fd);
    n_pend = 0;
    /* ordered by base, so that a sum reads the members in rank order */
    for (int i = 1; i < x->n_members; i++)
        for (int j = i; j > 0 && x->members[j].base < x->members[j - 1].base; j--) {
            member t = x->members[j];
            x->members[j] = x->members[j - 1];
            x->members[j - 1] = t;
        }
    for (int i = 0; i < x->n_members; i++) {
        member *m = &x->members[i];
        m->buf = malloc((size_t)m->n_local * CHUNK_FLOATS * sizeof(float));
        if (!m->buf) {
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    for (int i = 0; i < x->n_members; i++) {
        char who[32];
        if (reply_send(x->members[i].fd, FB_OK, NULL, x->timeout_ms) != 0) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "the process of %s left before the start",
                          ranks_name(who, sizeof who, x->members[i].base, x->members[i].n_local));
            goto fail;
        }
    }
    return FB_OK;

fail:
    for (int i = 0; i < n_pend; i++) close(pend[i].fd);
    /* the members that joined hear why the group did not form */
    for (int i = 0; i < x->n_members; i++) reply_send(x->members[i].fd, FB_ERR_IO, msg, 200);
    return err;
}

/* A member: connects to the root (retrying while it is not listening yet),
 * says hello and waits for go or a refusal. */
static int member_rendezvous(tcp_ctx *x, const char *root_addr, const unsigned char *token,
                             char *msg, size_t msg_cap)
{
    char host[256], serv[8], me[32], why[128];
    int err = split_addr(root_addr, false, host, sizeof host, serv, sizeof serv, msg, msg_cap);
    if (err) return err;
    if (atoi(serv) == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the root's address \"%s\" has port 0",
                       root_addr);
    ranks_name(me, sizeof me, x->base, x->n_local);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, serv, &hints, &ai);
    if (rc != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot resolve \"%s\": %s", root_addr,
                       gai_strerror(rc));
    int64_t deadline = mono_ms() + x->timeout_ms;
    int fd = -1;
    snprintf(why, sizeof why, "no address");
    bool off = false;
    while (fd < 0 && remaining_ms(deadline) > 0 && !(off = gave_up(x))) {
        for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0 || set_nonblocking(fd) != 0) {
                snprintf(why, sizeof why, "%s", strerror(errno));
                if (fd >= 0) close(fd);
                fd = -1;
                continue;
            }
            int c = connect(fd, a->ai_addr, a->ai_addrlen), e = c == 0 ? 0 : errno;
            if (e == EINPROGRESS) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                int p;
                do
                    p = poll(&pf, 1, remaining_ms(deadline));
                while (p < 0 && errno == EINTR);
                socklen_t el = sizeof e;
                if (p <= 0)
                    e = ETIMEDOUT;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
                    e = errno;
            }
            if (e != 0) {
                snprintf(why, sizeof why, "%s", strerror(e));
                close(fd);
                fd = -1;
            }
        }
        /* the root may not listen yet: try again a little later */
        if (fd < 0) {
            struct timespec ts = {0, 20 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    freeaddrinfo(ai);
    if (!off && fd >= 0) off = gave_up(x);
    if (off) {
        if (fd >= 0) close(fd);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "%s: joining rank 0's process at %s was called off",
                       me, root_addr);
    }
    if (fd < 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "%s cannot reach rank 0's process at %s: %s", me,
                       root_addr, why);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char h[HELLO_BYTES], r[REPLY_BYTES + REPLY_MSG_MAX + 1];
    hello_pack(h, x->world, x->base, x->n_local, token);
    if (io_write(fd, h, sizeof h, deadline, false, why, sizeof why) != 0) {
        close(fd);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "joining rank 0's process at %s: it %s", root_addr,
                       why);
    }
    /* the root answers once every rank has joined: wait for it in slices */
    for (;;) {
        if (gave_up(x)) {
            close(fd);
            return fb_errf(msg, msg_cap, FB_ERR_IO,
                           "%s: waiting for rank 0's process at %s was called off", me, root_addr);
        }
        int wait = remaining_ms(deadline);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int p = wait > 0 ? poll(&pf, 1, slice_ms(x, wait)) : 0;
        if (p != 0 || wait == 0) break; /* readable, an error, or the deadline: io_read says */
    }
    if (io_read(fd, r, REPLY_BYTES, deadline, why, sizeof why) != 0) {
        close(fd);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "joining rank 0's process at %s: it %s", root_addr,
                       why);
    }
    uint32_t tl = get_u32(r + 8);
    int status = (int)get_u32(r + 4);
    if (get_u32(r) != TCP_MAGIC || tl > REPLY_MSG_MAX ||
        io_read(fd, r + REPLY_BYTES, tl, deadline, why, sizeof why) != 0) {
        close(fd);
        return fb_errf(msg, msg_cap, FB_ERR_IO, "rank 0's process at %s answered the hello wrongly",
                       root_addr);
    }
    r[REPLY_BYTES + tl] = '\0';
    if (status != FB_OK) {
        close(fd);
        return fb_errf(msg, msg_cap, known_refusal(status), "rank 0's process refused %s: %s", me,
                       (char *)r + REPLY_BYTES);
    }
    x->members[0] = (member){.fd = fd, .base = 0, .n_local = 0};
    x->n_members = 1;
    return FB_OK;
}

/* ---- sums ------------------------------------------------------------------------------ */

/* Breaks the stream for good: every later call fails with this message. */
static int tcp_break(tcp_ctx *x, int err, char *msg, size_t msg_cap)
{
    x->broken = err;
    snprintf(x->broken_msg, sizeof x->broken_msg, "%s", msg);
    return err;
}

static int root_sum(tcp_ctx *x, float *const *bufs, size_t n, char *msg, size_t msg_cap)
{
    const float *src[FB_COMM_MAX_WORLD];
    unsigned char hdr[CHUNK_HDR_BYTES], rep[REPLY_BYTES];
    char who[32], why[128];
    int err = FB_OK;
    for (size_t off = 0; off < n && !err; off += CHUNK_FLOATS) {
        size_t count = n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS;
        for (int r = 0; r < x->n_local; r++) src[r] = bufs[r] + off;
        for (int i = 0; i < x->n_members && !err; i++) {
            member *m = &x->members[i];
            ranks_name(who, sizeof who, m->base, m->n_local);
            int64_t deadline = mono_ms() + x->timeout_ms;
            if (io_read(m->fd, hdr, sizeof hdr, deadline, why, sizeof why) != 0) {
                err = fb_errf(msg, msg_cap, FB_ERR_IO, "the process of %s %s (sum %llu)", who, why,
                              (unsigned long long)x->seq);
                break;
            }
            uint64_t seq = get_u64(hdr + 8), hn = get_u64(hdr + 16), hoff = get_u64(hdr + 24);
            uint32_t hc = get_u32(hdr + 4);
            if (get_u32(hdr) != SUM_MAGIC || seq != x->seq || hn != n || hoff != off ||
                hc != count) {
                err = fb_errf(msg, msg_cap, FB_ERR_IO,
                              "the process of %s sent %u floats at %llu of a sum of %llu "
                              "(sum %llu); rank 0 has %zu at %zu of %zu (sum %llu)",
                              who, hc, (unsigned long long)hoff, (unsigned long long)hn,
                              (unsigned long long)seq, count, off, n, (unsigned long long)x->seq);
                break;
            }
            if (io_read(m->fd, m->buf, (size_t)m->n_local * count * sizeof(float), deadline, why,
                        sizeof why) != 0) {
                err = fb_errf(msg, msg_cap, FB_ERR_IO, "the process of %s %s (sum %llu)", who, why,
                              (unsigned long long)x->seq);
                break;
            }
            for (int j = 0; j < m->n_local; j++) src[m->base + j] = m->buf + (size_t)j * count;
        }
        if (err) break;
        /* the shared-memory loop over the whole world: the same floats as shm */
        int W = x->world;
        for (size_t i = 0; i < count; i++) {
            float s = src[0][i];
            for (int r = 1; r < W; r++) s += src[r][i];
            for (int r = 0; r < x->n_local; r++) bufs[r][off + i] = s;
        }
        put_u32(rep, SUM_MAGIC);
        put_u32(rep + 4, 0);
        put_u32(rep + 8, (uint32_t)count);
        put_u32(rep + 12, 0);
        for (int i = 0; i < x->n_members && !err; i++) {
            member *m = &x->members[i];
            int64_t deadline = mono_ms() + x->timeout_ms;
            if (io_write(m->fd, rep, sizeof rep, deadline, false, why, sizeof why) != 0 ||
                io_write(m->fd, bufs[0] + off, count * sizeof(float), deadline, false, why,
                         sizeof why) != 0)
                err = fb_errf(msg, msg_cap, FB_ERR_IO, "sending the sum to the process of %s: %s",
                              ranks_name(who, sizeof who, m->base, m->n_local), why);
        }
    }
    if (err) {
        /* every member hears why, instead of waiting out its timeout */
        unsigned char r[REPLY_BYTES + REPLY_MSG_MAX];
        size_t tl = strlen(msg) < REPLY_MSG_MAX ? strlen(msg) : REPLY_MSG_MAX;
        put_u32(r, SUM_MAGIC);
        put_u32(r + 4, (uint32_t)FB_ERR_IO);
        put_u32(r + 8, 0);
        put_u32(r + 12, (uint32_t)tl);
        memcpy(r + REPLY_BYTES, msg, tl);
        for (int i = 0; i < x->n_members; i++)
            io_write(x->members[i].fd, r, REPLY_BYTES + tl, mono_ms() + 500, false, why,
                     sizeof why);
        return tcp_break(x, err, msg, msg_cap);
    }
    return FB_OK;
}

static int member_sum(tcp_ctx *x, float *const *bufs, size_t n, char *msg, size_t msg_cap)
{
    int fd = x->members[0].fd;
    unsigned char hdr[CHUNK_HDR_BYTES], rep[REPLY_BYTES + REPLY_MSG_MAX + 1];
    char why[128];
    for (size_t off = 0; off < n; off += CHUNK_FLOATS) {
        size_t count = n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS;
        put_u32(hdr, SUM_MAGIC);
        put_u32(hdr + 4, (uint32_t)count);
        put_u64(hdr + 8, x->seq);
        put_u64(hdr + 16, n);
        put_u64(hdr + 24, off);
        int64_t deadline = mono_ms() + x->timeout_ms;
        int rc = io_write(fd, hdr, sizeof hdr, deadline, true, why, sizeof why);
        for (int r = 0; r < x->n_local && rc == 0; r++)
            rc = io_write(fd, bufs[r] + off, count * sizeof(float), deadline, true, why,
                          sizeof why);
        if (rc == IO_FAILED)
            return tcp_break(x,
                             fb_errf(msg, msg_cap, FB_ERR_IO,
                                     "sending to rank 0's process (sum %llu): %s",
                                     (unsigned long long)x->seq, why),
                             msg, msg_cap);
        /* the answer: the sum, or the root's reason for failing (which may
         * come before this chunk was sent in full).  Twice the timeout: the
         * root gives up on a silent peer after one, and then says which. */
        deadline = mono_ms() + 2 * (int64_t)x->timeout_ms;
        if (io_read(fd, rep, REPLY_BYTES, deadline, why, sizeof why) != 0)
            return tcp_break(x,
                             fb_errf(msg, msg_cap, FB_ERR_IO, "rank 0's process %s (sum %llu)", why,
                                     (unsigned long long)x->seq),
                             msg, msg_cap);
        int status = (int)get_u32(rep + 4);
        uint32_t rc_count = get_u32(rep + 8), tl = get_u32(rep + 12);
        if (get_u32(rep) != SUM_MAGIC || tl > REPLY_MSG_MAX ||
            (status == FB_OK && rc_count != count))
            return tcp_break(x,
                             fb_errf(msg, msg_cap, FB_ERR_IO,
                                     "rank 0's process answered %u floats for %zu (sum %llu)",
                                     rc_count, count, (unsigned long long)x->seq),
                             msg, msg_cap);
        if (status != FB_OK) {
            if (io_read(fd, rep + REPLY_BYTES, tl, mono_ms() + 500, why, sizeof why) != 0) tl = 0;
            rep[REPLY_BYTES + tl] = '\0';
            return tcp_break(x,
                             fb_errf(msg, msg_cap, FB_ERR_IO, "rank 0's process failed: %s",
                                     (char *)rep + REPLY_BYTES),
                             msg, msg_cap);
        }
        if (io_read(fd, bufs[0] + off, count * sizeof(float), deadline, why, sizeof why) != 0)
            return tcp_break(x,
                             fb_errf(msg, msg_cap, FB_ERR_IO,
                                     "rank 0's process %s in the middle of a sum (sum %llu)", why,
                                     (unsigned long long)x->seq),
                             msg, msg_cap);
        for (int r = 1; r < x->n_local; r++)
            memcpy(bufs[r] + off, bufs[0] + off, count * sizeof(float));
    }
    return FB_OK;
}

static int tcp_allreduce(fb_comm *c, float *const *bufs, size_t n, char *msg, size_t msg_cap)
{
    tcp_ctx *x = c->ctx;
    if (x->broken)
        return fb_errf(msg, msg_cap, x->broken, "the communicator failed before: %s",
                       x->broken_msg);
    int err = x->root ? root_sum(x, bufs, n, msg, msg_cap) : member_sum(x, bufs, n, msg, msg_cap);
    x->seq++;
    return err;
}

static void tcp_release(tcp_ctx *x)
{
    if (x->root && x->broken) {
        /* Members may have sent a chunk that the root never read.  Closing
         * with unread data resets the connection, and a reset can drop the
         * error reply before the member has read it; so say no more and
         * read what they still send, until they close or a moment passes. */
        int64_t deadline = mono_ms() + 500;
        int open = 0;
        for (int i = 0; i < x->n_members; i++) {
            if (shutdown(x->members[i].fd, SHUT_WR) == 0) {
                open++;
            } else {
                close(x->members[i].fd);
                x->members[i].fd = -1;
            }
        }
        while (open > 0 && remaining_ms(deadline) > 0) {
            struct pollfd pf[FB_COMM_MAX_WORLD];
            for (int i = 0; i < x->n_members; i++)
                pf[i] = (struct pollfd){.fd = x->members[i].fd, .events = POLLIN};
            if (poll(pf, (nfds_t)x->n_members, remaining_ms(deadline)) <= 0) continue;
            for (int i = 0; i < x->n_members; i++) {
                if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)) || x->members[i].fd < 0)
                    continue;
                char scratch[4096];
                ssize_t k = recv(x->members[i].fd, scratch, sizeof scratch, 0);
                if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
                    close(x->members[i].fd);
                    x->members[i].fd = -1;
                    open--;
                }
            }
        }
    }
    for (int i = 0; i < x->n_members; i++) {
        if (x->members[i].fd >= 0) close(x->members[i].fd);
        free(x->members[i].buf);
    }
    free(x);
}

static void tcp_free(fb_comm *c)
{
    if (c->ctx) tcp_release(c->ctx);
}

static const struct fb_comm_ops tcp_ops = {
    .name = "tcp",
    .host_memory = 1,
    .allreduce_sum = tcp_allreduce,
    .free = tcp_free,
};

int fb_comm_tcp_new(int n_local, int base, int world, const char *root_addr,
                    fb_comm_tcp_listener *listener, const unsigned char token[FB_COMM_TOKEN_BYTES],
                    int timeout_ms, fb_comm **out, char *msg, size_t msg_cap)
{
    return fb_comm_tcp_new_until(n_local, base, world, root_addr, listener, token, timeout_ms,
                                 NULL, NULL, out, msg, msg_cap);
}

int fb_comm_tcp_new_until(int n_local, int base, int world, const char *root_addr,
                          fb_comm_tcp_listener *listener,
                          const unsigned char token[FB_COMM_TOKEN_BYTES], int timeout_ms,
                          bool (*give_up)(void *), void *give_up_arg, fb_comm **out, char *msg,
                          size_t msg_cap)
{
    if (!out || !token) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (world < 1 || world > FB_COMM_MAX_WORLD)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a world of %d ranks (1..%d)", world,
                       FB_COMM_MAX_WORLD);
    if (n_local < 1 || base < 0 || base >= world || n_local > world - base)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%d local ranks from rank %d do not fit a world of %d", n_local, base,
                       world);
    if (timeout_ms < 1 || timeout_ms > TIMEOUT_MAX_MS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "timeout of %d ms (1..%d)", timeout_ms,
                       TIMEOUT_MAX_MS);
    if (base > 0 && listener)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "only the process holding rank 0 listens; this one starts at rank %d",
                       base);
    fb_comm *c = calloc(1, sizeof *c);
    tcp_ctx *x = calloc(1, sizeof *x);
    fb_comm_tcp_listener *own = NULL;
    int err = FB_OK;
    if (!c || !x) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    x->base = base;
    x->n_local = n_local;
    x->world = world;
    x->timeout_ms = timeout_ms;
    x->root = base == 0;
    x->give_up = give_up;
    x->give_up_arg = give_up_arg;
    if (x->root && n_local < world) {
        if (!listener) {
            if ((err = fb_comm_tcp_listen(root_addr, &own, NULL, msg, msg_cap))) goto fail;
            listener = own;
        }
        err = root_rendezvous(x, listener->fd, token, msg, msg_cap);
    } else if (!x->root) {
        err = member_rendezvous(x, root_addr, token, msg, msg_cap);
    }
    if (err) goto fail;
    fb_comm_tcp_listener_free(own);
    c->ops = &tcp_ops;
    c->n_local = n_local;
    c->ctx = x;
    *out = c;
    return FB_OK;

fail:
    fb_comm_tcp_listener_free(own);
    if (x) tcp_release(x);
    free(c);
    return err;
}

int fb_comm_tcp_layout(const fb_comm *c, int *base, int *world, char *msg, size_t msg_cap)
{
    if (!c || c->ops != &tcp_ops)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "the %s communicator does not span processes", c ? c->ops->name : "(null)");
    const tcp_ctx *x = c->ctx;
    if (base) *base = x->base;
    if (world) *world = x->world;
    return FB_OK;
}
