/*
 * One quiver sender or receiver in C, so a benchmark's clients take little of the cores the
 * server needs (docs/workers.md, "Measured"). sluicegate quiver --impl c runs one process per
 * arrow (clients/quiver/native.py) and they talk through lines of text:
 *
 *   stdout  ready                                 the receiver's link is attached
 *           progress COUNT SETTLED LATENCY_NS     every TICK_MS
 *           done COUNT SETTLED FIRST_NS LAST_NS CPU_NS
 *           failed REASON                         one line, then exit status 1
 *   stdin   stop                                  receiver: every expected message arrived
 *           (end of file)                         the parent is gone: exit without a report
 *
 * COUNT is messages sent or received; SETTLED is outcomes (sender) or stale messages drained
 * (receiver); FIRST_NS and LAST_NS are wall-clock nanoseconds, -1 for none; CPU_NS is this
 * process's CPU time. The receiver writes every latency (int64 nanoseconds, native order) to
 * the --latencies file before its done line.
 *
 * Messages are those of the Python arrows (clients/quiver/payload.py): one encoded template,
 * its body's first 8 bytes the big-endian send time, patched per message; the receiver reads
 * the stamp body_size bytes before the end of the raw transfer, without decoding.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>

enum {
    TICK_MS = 100,      /* counters published, stdin polled: the Python arrows' 10 Hz */
    STAMP_SIZE = 8,     /* big-endian int64 nanoseconds opening every body */
    HEADROOM = 1024,    /* bytes a broker may put before a body, as in receiver.py */
    MAX_VBIN8 = 255,    /* the largest binary length one byte holds */
    VBIN8 = 0xa0,
    VBIN32 = 0xb0,
    DATA_SECTION = 0x75,
    VALUE_SECTION = 0x77,
};

typedef struct {
    bool sender;
    const char *name, *host, *port, *address, *latency_path;
    int64_t count; /* 0: no limit (a --duration sender, or a receiver told to stop) */
    double duration_s, timeout_s;
    size_t body_size;
    int credit;
    bool durable, presettled;
    int64_t not_before_ns;
} config_t;

typedef struct {
    config_t cfg;
    pn_proactor_t *proactor;
    pn_connection_t *connection;
    pn_link_t *link;
    bool connected, attached, checked, finished, failed, closing;
    int64_t count, settled, accepted, first_ns, last_ns, latest_ns;
    int64_t deadline_ns;   /* monotonic: end of a --duration run; when closing, of the wait */
    int64_t start_cpu_ns;
    char *buffer;          /* sender: the template; receiver: the last transfer */
    size_t size, capacity, stamp_offset;
    int used;              /* receiver: credit spent since the last top-up */
    int64_t *latencies;
    size_t n_latencies, latency_capacity;
    char stdin_line[64];
    size_t stdin_used;
} arrow_t;

static int64_t clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *must(void *pointer) {
    if (pointer == NULL) {
        fputs("failed out of memory\n", stdout);
        exit(1);
    }
    return pointer;
}

static void report(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vfprintf(stdout, format, args);
    va_end(args);
    fflush(stdout);
}

static void close_connection(arrow_t *a) {
    if (!a->closing) {
        a->closing = true;
        a->deadline_ns = clock_ns(CLOCK_MONOTONIC) + (int64_t)(a->cfg.timeout_s * 1e9);
        if (a->connection != NULL) pn_connection_close(a->connection);
    }
}

static void fail(arrow_t *a, const char *reason) {
    if (a->finished) return;
    a->finished = true;
    a->failed = true;
    report("failed %s\n", reason);
    close_connection(a);
}

/* One line from an AMQP error condition, as describe() in arrow.py words it. */
static void fail_condition(arrow_t *a, pn_condition_t *condition, const char *otherwise) {
    char line[512];
    if (condition == NULL || !pn_condition_is_set(condition)) {
        fail(a, otherwise);
        return;
    }
    const char *description = pn_condition_get_description(condition);
    const char *name = pn_condition_get_name(condition);
    if (description != NULL && *description)
        snprintf(line, sizeof line, "%s (%s)", description, name ? name : "");
    else
        snprintf(line, sizeof line, "%s", name ? name : otherwise);
    fail(a, line);
}

static void finish(arrow_t *a) {
    if (a->finished) return;
    if (!a->cfg.sender && a->cfg.latency_path != NULL) {
        FILE *file = fopen(a->cfg.latency_path, "wb");
        if (file == NULL ||
            fwrite(a->latencies, sizeof *a->latencies, a->n_latencies, file) != a->n_latencies ||
            fclose(file) != 0) {
            fail(a, "cannot write the latencies");
            return;
        }
    }
    a->finished = true;
    int64_t cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - a->start_cpu_ns;
    report("done %lld %lld %lld %lld %lld\n", (long long)a->count,
           (long long)(a->cfg.sender ? a->accepted : a->settled), (long long)a->first_ns,
           (long long)a->last_ns, (long long)cpu);
    close_connection(a);
}

static void put_be64(char *to, uint64_t value) {
    for (int i = STAMP_SIZE - 1; i >= 0; --i, value >>= 8) to[i] = (char)(value & 0xff);
}

static int64_t get_be64(const char *from) {
    uint64_t value = 0;
    for (int i = 0; i < STAMP_SIZE; ++i) value = value << 8 | (uint8_t)from[i];
    return (int64_t)value;
}

/* The message every send repeats: a zeroed binary body in a data section (payload.py). */
static void encode_template(arrow_t *a) {
    pn_message_t *message = must(pn_message());
    pn_message_set_durable(message, a->cfg.durable);
    pn_message_set_inferred(message, true);
    char *zeros = must(calloc(a->cfg.body_size, 1));
    pn_data_put_binary(pn_message_body(message), pn_bytes(a->cfg.body_size, zeros));
    free(zeros);
    a->capacity = a->cfg.body_size + HEADROOM;
    for (;;) {
        a->buffer = must(realloc(a->buffer, a->capacity));
        a->size = a->capacity;
        int status = pn_message_encode(message, a->buffer, &a->size);
        if (status == 0) break;
        if (status != PN_OVERFLOW) {
            fputs("failed cannot encode the message\n", stdout);
            exit(1);
        }
        a->capacity *= 2;
    }
    a->stamp_offset = a->size - a->cfg.body_size;
    pn_message_free(message);
}

static bool more(const arrow_t *a) {
    return !a->finished && (a->cfg.count == 0 || a->count < a->cfg.count) &&
           (a->deadline_ns == 0 || clock_ns(CLOCK_MONOTONIC) < a->deadline_ns);
}

static void sender_maybe_done(arrow_t *a) {
    if (!a->finished && a->attached && !more(a) && (a->cfg.presettled || a->settled == a->count))
        finish(a);
}

static void send_messages(arrow_t *a) {
    pn_link_t *link = a->link;
    if (!a->attached || a->closing) return;
    if (a->first_ns < 0 && pn_link_credit(link) > 0 && more(a))
        a->first_ns = clock_ns(CLOCK_REALTIME);
    while (pn_link_credit(link) > 0 && (a->cfg.count == 0 || a->count < a->cfg.count)) {
        if (a->deadline_ns != 0 && clock_ns(CLOCK_MONOTONIC) >= a->deadline_ns) break;
        uint64_t tag = (uint64_t)++a->count;
        char tag_bytes[sizeof tag];
        put_be64(tag_bytes, tag);
        put_be64(a->buffer + a->stamp_offset, (uint64_t)clock_ns(CLOCK_REALTIME));
        pn_delivery_t *delivery = pn_delivery(link, pn_dtag(tag_bytes, sizeof tag_bytes));
        pn_link_send(link, a->buffer, a->size);
        pn_link_advance(link);
        if (a->cfg.presettled) pn_delivery_settle(delivery);
        a->last_ns = clock_ns(CLOCK_REALTIME);
    }
    sender_maybe_done(a);
}

static void take_outcome(arrow_t *a, pn_delivery_t *delivery) {
    uint64_t outcome = pn_delivery_remote_state(delivery);
    if (outcome != PN_ACCEPTED && outcome != PN_REJECTED && outcome != PN_RELEASED &&
        outcome != PN_MODIFIED)
        return;
    a->settled++;
    if (outcome == PN_ACCEPTED) a->accepted++;
    pn_delivery_settle(delivery);
    sender_maybe_done(a);
}

/* Never grant beyond what this receiver may still take. */
static void grant(arrow_t *a, int credit) {
    if (a->cfg.count != 0) {
        int64_t room = a->cfg.count - a->count - pn_link_credit(a->link);
        if (room < credit) credit = (int)room;
    }
    if (credit > 0) pn_link_flow(a->link, credit);
}

/* The first message must end with a binary body of body_size bytes (check_stamped). */
static bool stamped(const arrow_t *a, size_t size) {
    size_t body = a->cfg.body_size;
    const uint8_t sections[] = {DATA_SECTION, VALUE_SECTION};
    for (size_t i = 0; i < sizeof sections; ++i) {
        uint8_t short_header[] = {0x00, 0x53, sections[i], VBIN8, (uint8_t)body};
        uint8_t long_header[] = {0x00,           0x53, sections[i], VBIN32, (uint8_t)(body >> 24),
                                 (uint8_t)(body >> 16), (uint8_t)(body >> 8), (uint8_t)body};
        if (body <= MAX_VBIN8 && size >= body + sizeof short_header &&
            memcmp(a->buffer + size - body - sizeof short_header, short_header,
                   sizeof short_header) == 0)
            return true;
        if (size >= body + sizeof long_header &&
            memcmp(a->buffer + size - body - sizeof long_header, long_header,
                   sizeof long_header) == 0)
            return true;
    }
    return false;
}

static void receive_messages(arrow_t *a) {
    pn_link_t *link = a->link;
    pn_delivery_t *delivery;
    while (!a->finished && (delivery = pn_link_current(link)) != NULL &&
           pn_delivery_readable(delivery) && !pn_delivery_partial(delivery)) {
        size_t size = pn_delivery_pending(delivery);
        if (size > a->capacity) {
            a->capacity = size;
            a->buffer = must(realloc(a->buffer, a->capacity));
        }
        pn_link_recv(link, a->buffer, size);
        pn_link_advance(link);
        int64_t now = clock_ns(CLOCK_REALTIME);
        if (!a->checked && !stamped(a, size)) {
            char reason[160];
            snprintf(reason, sizeof reason, "%s: a %zu-byte message without a %zu-byte binary "
                     "body at its end", a->cfg.address, size, a->cfg.body_size);
            fail(a, reason);
            return;
        }
        a->checked = true;
        int64_t sent_ns = get_be64(a->buffer + size - a->cfg.body_size);
        if (!pn_delivery_settled(delivery)) pn_delivery_update(delivery, PN_ACCEPTED);
        pn_delivery_settle(delivery);
        if (sent_ns < a->cfg.not_before_ns) {
            a->settled++; /* left by an earlier run: drained, not measured */
        } else {
            if (a->first_ns < 0) a->first_ns = now;
            if (a->n_latencies == a->latency_capacity) {
                a->latency_capacity = a->latency_capacity ? 2 * a->latency_capacity : 65536;
                a->latencies = must(realloc(a->latencies, a->latency_capacity * sizeof(int64_t)));
            }
            a->latest_ns = now - sent_ns;
            a->latencies[a->n_latencies++] = a->latest_ns;
            a->last_ns = now;
            a->count++;
        }
        if (++a->used >= (a->cfg.credit / 2 > 0 ? a->cfg.credit / 2 : 1)) {
            grant(a, a->used);
            a->used = 0;
        }
        if (a->cfg.count != 0 && a->count == a->cfg.count) finish(a);
    }
}

/* Take the parent's stop; end of file means the parent is gone. */
static void read_stdin(arrow_t *a) {
    struct pollfd in = {.fd = STDIN_FILENO, .events = POLLIN};
    while (poll(&in, 1, 0) > 0) {
        size_t room = sizeof a->stdin_line - a->stdin_used - 1;
        ssize_t got = read(STDIN_FILENO, a->stdin_line + a->stdin_used, room);
        if (got <= 0) {
            a->finished = true; /* quietly: nobody reads a report */
            close_connection(a);
            return;
        }
        a->stdin_used += (size_t)got;
        a->stdin_line[a->stdin_used] = '\0';
        char *newline;
        while ((newline = strchr(a->stdin_line, '\n')) != NULL) {
            *newline = '\0';
            if (strcmp(a->stdin_line, "stop") == 0) finish(a);
            size_t rest = a->stdin_used - (size_t)(newline + 1 - a->stdin_line);
            memmove(a->stdin_line, newline + 1, rest + 1);
            a->stdin_used = rest;
        }
        if (a->stdin_used == sizeof a->stdin_line - 1) a->stdin_used = 0; /* not ours: drop */
    }
}

static void open_link(arrow_t *a) {
    pn_connection_t *connection = a->connection;
    pn_connection_set_container(connection, a->cfg.name);
    pn_connection_set_hostname(connection, a->cfg.host);
    pn_connection_open(connection);
    pn_session_t *session = pn_session(connection);
    pn_session_open(session);
    char link_name[256];
    snprintf(link_name, sizeof link_name, "%s %d", a->cfg.name, (int)getpid());
    if (a->cfg.sender) {
        a->link = pn_sender(session, link_name);
        pn_terminus_set_address(pn_link_target(a->link), a->cfg.address);
        pn_link_set_snd_settle_mode(a->link, a->cfg.presettled ? PN_SND_SETTLED : PN_SND_UNSETTLED);
        pn_link_open(a->link);
    } else {
        a->link = pn_receiver(session, link_name);
        pn_terminus_set_address(pn_link_source(a->link), a->cfg.address);
        if (a->cfg.presettled) pn_link_set_snd_settle_mode(a->link, PN_SND_SETTLED);
        pn_link_open(a->link);
        int credit = a->cfg.credit;
        if (a->cfg.count != 0 && a->cfg.count < credit) credit = (int)a->cfg.count;
        pn_link_flow(a->link, credit);
    }
}

/* The timer's share of the work, in the connection's own batch (PN_CONNECTION_WAKE): only
 * there do its changes reach the socket when the batch is done. */
static void tick(arrow_t *a) {
    read_stdin(a);
    int64_t now = clock_ns(CLOCK_MONOTONIC);
    if (!a->attached && !a->finished && now >= a->deadline_ns) {
        char reason[256];
        snprintf(reason, sizeof reason, "no attach from %s:%s within %g s", a->cfg.host,
                 a->cfg.port, a->cfg.timeout_s);
        fail(a, reason);
    }
    if (a->cfg.sender) {
        send_messages(a);
        sender_maybe_done(a);
    }
}

/* Handle one event; false once the connection is gone and nothing is left to do. */
static bool handle(arrow_t *a, pn_event_t *event) {
    switch (pn_event_type(event)) {
    case PN_CONNECTION_INIT:
        open_link(a);
        break;
    case PN_CONNECTION_REMOTE_OPEN:
        a->connected = true;
        break;
    case PN_LINK_REMOTE_OPEN:
        if (pn_event_link(event) != a->link || a->attached) break;
        a->attached = true;
        if (a->cfg.sender) {
            a->deadline_ns = a->cfg.duration_s > 0
                                 ? clock_ns(CLOCK_MONOTONIC) + (int64_t)(a->cfg.duration_s * 1e9)
                                 : 0;
            send_messages(a);
        } else if (pn_terminus_get_address(pn_link_remote_source(a->link)) != NULL) {
            report("ready\n");
        } /* else the peer refused the address: its detach says why */
        break;
    case PN_LINK_FLOW:
        if (a->cfg.sender) send_messages(a);
        break;
    case PN_DELIVERY:
        if (a->cfg.sender)
            take_outcome(a, pn_event_delivery(event));
        else
            receive_messages(a);
        break;
    case PN_LINK_REMOTE_CLOSE:
        if (!a->closing)
            fail_condition(a, pn_link_remote_condition(pn_event_link(event)),
                           "link detached by the peer");
        break;
    case PN_CONNECTION_REMOTE_CLOSE:
        if (a->closing) return false; /* the peer answered our close: nothing more to say */
        fail_condition(a, pn_connection_remote_condition(pn_event_connection(event)),
                       "connection closed by the peer");
        break;
    case PN_TRANSPORT_CLOSED:
        if (!a->finished) {
            char otherwise[256];
            snprintf(otherwise, sizeof otherwise, "connection to %s:%s lost", a->cfg.host,
                     a->cfg.port);
            pn_condition_t *condition = pn_transport_condition(pn_event_transport(event));
            if (condition != NULL && pn_condition_is_set(condition)) {
                /* proactor's "Connection refused - disconnected HOST:PORT": the first part */
                const char *description = pn_condition_get_description(condition);
                if (description == NULL) description = pn_condition_get_name(condition);
                const char *tail = strstr(description, " - ");
                int length = tail ? (int)(tail - description) : (int)strlen(description);
                char reason[512];
                snprintf(reason, sizeof reason, a->connected ? "connection to %s:%s failed: %.*s"
                                                             : "cannot connect to %s:%s: %.*s",
                         a->cfg.host, a->cfg.port, length, description);
                fail(a, reason);
            } else {
                fail(a, otherwise);
            }
        }
        a->connection = NULL;
        return false;
    case PN_CONNECTION_WAKE:
        tick(a);
        break;
    case PN_PROACTOR_TIMEOUT:
        if (!a->finished)
            report("progress %lld %lld %lld\n", (long long)a->count, (long long)a->settled,
                   (long long)a->latest_ns);
        if (a->connection != NULL) pn_connection_wake(a->connection);
        if (a->closing && clock_ns(CLOCK_MONOTONIC) >= a->deadline_ns) return false;
        pn_proactor_set_timeout(a->proactor, TICK_MS);
        break;
    case PN_PROACTOR_INACTIVE:
        return false;
    default:
        break;
    }
    return true;
}

static void usage(void) {
    fputs("usage: arrow sender|receiver --host H --port P --address A [--name N] [--count N]\n"
          "       [--duration S] [--body-size B] [--credit C] [--durable] [--presettled]\n"
          "       [--not-before NS] [--timeout S] [--latencies FILE]\n", stderr);
    exit(2);
}

static void parse(int argc, char **argv, config_t *cfg) {
    static const struct option options[] = {
        {"host", required_argument, NULL, 'h'},      {"port", required_argument, NULL, 'p'},
        {"address", required_argument, NULL, 'a'},   {"name", required_argument, NULL, 'n'},
        {"count", required_argument, NULL, 'c'},     {"duration", required_argument, NULL, 'd'},
        {"body-size", required_argument, NULL, 'b'}, {"credit", required_argument, NULL, 'r'},
        {"durable", no_argument, NULL, 'D'},         {"presettled", no_argument, NULL, 'P'},
        {"not-before", required_argument, NULL, 'N'}, {"timeout", required_argument, NULL, 't'},
        {"latencies", required_argument, NULL, 'l'}, {NULL, 0, NULL, 0},
    };
    if (argc < 2) usage();
    cfg->sender = strcmp(argv[1], "sender") == 0;
    if (!cfg->sender && strcmp(argv[1], "receiver") != 0) usage();
    cfg->name = argv[1];
    cfg->body_size = 100;
    cfg->credit = 1000;
    cfg->timeout_s = 10;
    int option;
    optind = 2;
    while ((option = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (option) {
        case 'h': cfg->host = optarg; break;
        case 'p': cfg->port = optarg; break;
        case 'a': cfg->address = optarg; break;
        case 'n': cfg->name = optarg; break;
        case 'c': cfg->count = strtoll(optarg, NULL, 10); break;
        case 'd': cfg->duration_s = strtod(optarg, NULL); break;
        case 'b': cfg->body_size = (size_t)strtoull(optarg, NULL, 10); break;
        case 'r': cfg->credit = atoi(optarg); break;
        case 'D': cfg->durable = true; break;
        case 'P': cfg->presettled = true; break;
        case 'N': cfg->not_before_ns = strtoll(optarg, NULL, 10); break;
        case 't': cfg->timeout_s = strtod(optarg, NULL); break;
        case 'l': cfg->latency_path = optarg; break;
        default: usage();
        }
    }
    if (optind != argc || cfg->host == NULL || cfg->port == NULL || cfg->address == NULL ||
        cfg->body_size < STAMP_SIZE || cfg->credit < 1 || cfg->count < 0 || cfg->timeout_s <= 0)
        usage();
}

int main(int argc, char **argv) {
    arrow_t a = {.first_ns = -1, .last_ns = -1};
    parse(argc, argv, &a.cfg);
    a.start_cpu_ns = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    if (a.cfg.sender) {
        encode_template(&a);
    } else {
        a.capacity = a.cfg.body_size + HEADROOM;
        a.buffer = must(malloc(a.capacity));
    }
    a.deadline_ns = clock_ns(CLOCK_MONOTONIC) + (int64_t)(a.cfg.timeout_s * 1e9); /* attach */
    a.proactor = must(pn_proactor());
    a.connection = must(pn_connection());
    char address[512];
    snprintf(address, sizeof address, "%s:%s", a.cfg.host, a.cfg.port);
    pn_proactor_connect2(a.proactor, a.connection, NULL, address);
    pn_proactor_set_timeout(a.proactor, TICK_MS);
    bool running = true;
    while (running) {
        pn_event_batch_t *batch = pn_proactor_wait(a.proactor);
        pn_event_t *event;
        while (running && (event = pn_event_batch_next(batch)) != NULL)
            running = handle(&a, event);
        pn_proactor_done(a.proactor, batch);
    }
    pn_proactor_free(a.proactor);
    free(a.buffer);
    free(a.latencies);
    return a.failed ? 1 : 0;
}
