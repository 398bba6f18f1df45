/*
 * fusebox-data: build and check shard datasets (docs/data-format.md).
 *
 *   fusebox-data import idx --images F --labels F --out DIR --name NAME --split S [...]
 *   fusebox-data import csv FILE --label-column NAME|INDEX --out DIR --name NAME --split S [...]
 *   fusebox-data import text FILE... | --builtin licenses --context T [--stride S] --out DIR
 *                            --name NAME --split S [...]
 *   fusebox-data inspect DIR
 *   fusebox-data verify DIR
 *
 * Exit status: 0 success, 1 a data or I/O error (the message names the file
 * and, where there is one, the chunk), 2 a usage error, 3 the output's file
 * system is full (ENOSPC, EDQUOT): kept apart from 1 so that fuseboxd can
 * tell a tenant that the server ran out of space, not that the data is bad.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datadir.h"
#include "manifest_file.h"
#include "shard.h"

#define EXIT_DATA 1
#define EXIT_USAGE 2
#define EXIT_NO_SPACE 3

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fusebox-data import idx --images FILE --labels FILE --out DIR --name NAME\n"
            "                               --split SPLIT [options]\n"
            "       fusebox-data import csv FILE --label-column NAME|INDEX --out DIR --name NAME\n"
            "                               --split SPLIT [--header | --no-header] [options]\n"
            "       fusebox-data import text FILE... --context T [--stride S] --out DIR\n"
            "                               --name NAME --split SPLIT [options]\n"
            "       fusebox-data import text --builtin licenses [--builtin-dir DIR] --context T\n"
            "                               [--stride S] --out DIR --name NAME --split SPLIT\n"
            "       fusebox-data inspect DIR\n"
            "       fusebox-data verify DIR\n"
            "       fusebox-data --version\n"
            "\n"
            "Builds and checks shard datasets: zstd-compressed, CRC32C-checksummed record\n"
            "shards plus a manifest.json (docs/data-format.md).  IDX files may be gzipped.\n"
            "\n"
            "import options:\n"
            "  --chunk-records N  records per chunk (default: about 256 KiB of data)\n"
            "  --shard-records N  records per shard (default: about 64 MiB of data)\n"
            "  --level L          zstd level, -7..19 (default 3)\n"
            "  --header, --no-header   whether the CSV's first line names the columns\n"
            "                     (default: a header when a field of it is not a number)\n"
            "  --context T        text: tokens a record predicts from, 1..65536; records\n"
            "                     hold T + 1 byte-level tokens (ids 0..255, vocab 256)\n"
            "  --stride S         text: bytes from one record's start to the next (default T)\n"
            "  --builtin licenses text: the licence texts of /usr/share/common-licenses\n"
            "                     (GPL-3, GPL-2, LGPL-3, LGPL-2.1, Apache-2.0, Artistic, BSD)\n"
            "  --builtin-dir DIR  text: read the built-in corpus from DIR instead\n"
            "Text files are joined in the order given, a newline after a file that does\n"
            "not end with one; bytes after the last whole record are left out.\n"
            "\n"
            "inspect prints the manifest and each shard's header; verify re-reads every shard\n"
            "and checks every checksum (file, header, index, chunks), every label and every\n"
            "token id.\n"
            "\n"
            "exit status: 0 ok, 1 bad data or an I/O error, 2 bad usage, 3 the output's file\n"
            "system is full\n");
}

static int exit_for(int err)
{
    if (err == FB_ERR_NO_SPACE) return EXIT_NO_SPACE;
    return err == FB_ERR_OUT_OF_RANGE || err == FB_ERR_INTERNAL ? EXIT_USAGE : EXIT_DATA;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static double mb(uint64_t b)
{
    return (double)b / 1e6;
}

static int cmd_import_text(int argc, char **argv);

static int cmd_import(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "fusebox-data import: say idx, csv or text\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *kind = argv[1];
    bool csv = strcmp(kind, "csv") == 0;
    if (strcmp(kind, "text") == 0) return cmd_import_text(argc, argv);
    if (!csv && strcmp(kind, "idx") != 0) {
        fprintf(stderr, "fusebox-data import: unknown source \"%s\" (idx, csv, text)\n", kind);
        return EXIT_USAGE;
    }
    static const struct option lo[] = {
        {"images", required_argument, NULL, 'i'},  {"labels", required_argument, NULL, 'l'},
        {"out", required_argument, NULL, 'o'},     {"name", required_argument, NULL, 'n'},
        {"split", required_argument, NULL, 's'},   {"chunk-records", required_argument, NULL, 'c'},
        {"shard-records", required_argument, NULL, 'r'}, {"level", required_argument, NULL, 'L'},
        {"label-column", required_argument, NULL, 'C'},  {"header", no_argument, NULL, 'H'},
        {"no-header", no_argument, NULL, 'N'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *images = NULL, *labels = NULL, *label_col = NULL;
    fb_import_opts o = {0};
    fb_csv_header hdr = FB_CSV_HEADER_AUTO;
    int64_t v;
    int opt;
    optind = 2;
    while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (opt) {
        case 'i': images = optarg; break;
        case 'l': labels = optarg; break;
        case 'o': o.out_dir = optarg; break;
        case 'n': o.name = optarg; break;
        case 's': o.split = optarg; break;
        case 'C': label_col = optarg; break;
        case 'H': hdr = FB_CSV_HEADER_YES; break;
        case 'N': hdr = FB_CSV_HEADER_NO; break;
        case 'c':
            if (parse_i64(optarg, 1, FB_SHARD_MAX_CHUNK_RECORDS, &o.chunk_records)) {
                fprintf(stderr, "fusebox-data: --chunk-records needs an integer in [1, %" PRId64
                        "]\n", FB_SHARD_MAX_CHUNK_RECORDS);
                return EXIT_USAGE;
            }
            break;
        case 'r':
            if (parse_i64(optarg, 1, FB_SHARD_MAX_RECORDS, &o.shard_records)) {
                fprintf(stderr, "fusebox-data: --shard-records needs a positive integer\n");
                return EXIT_USAGE;
            }
            break;
        case 'L':
            if (parse_i64(optarg, -7, 19, &v) || v == 0) {
                fprintf(stderr, "fusebox-data: --level needs an integer in [-7, 19], not 0\n");
                return EXIT_USAGE;
            }
            o.level = (int)v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    const char *csv_file = NULL;
    if (csv) {
        if (optind != argc - 1) {
            fprintf(stderr, "fusebox-data import csv: give exactly one CSV file\n");
            return EXIT_USAGE;
        }
        csv_file = argv[optind];
        if (!label_col) {
            fprintf(stderr, "fusebox-data import csv: --label-column is required\n");
            return EXIT_USAGE;
        }
        if (images || labels) {
            fprintf(stderr, "fusebox-data import csv: --images/--labels are for idx\n");
            return EXIT_USAGE;
        }
    } else {
        if (optind != argc) {
            fprintf(stderr, "fusebox-data import idx: unexpected argument \"%s\"\n", argv[optind]);
            return EXIT_USAGE;
        }
        if (!images || !labels) {
            fprintf(stderr, "fusebox-data import idx: --images and --labels are required\n");
            return EXIT_USAGE;
        }
        if (label_col || hdr != FB_CSV_HEADER_AUTO) {
            fprintf(stderr, "fusebox-data import idx: --label-column/--header are for csv\n");
            return EXIT_USAGE;
        }
    }
    if (!o.out_dir || !o.name || !o.split) {
        fprintf(stderr, "fusebox-data import: --out, --name and --split are required\n");
        return EXIT_USAGE;
    }
    char msg[1024];
    fb_import_result r;
    int err = csv ? fb_datadir_import_csv(&r, &o, csv_file, label_col, hdr, msg, sizeof msg)
                  : fb_datadir_import_idx(&r, &o, images, labels, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-data: %s (%s)\n", msg, fb_err_code(err));
        return exit_for(err);
    }
    printf("imported %" PRId64 " samples as %s/%s in %s: %" PRId64 " shard%s, %" PRId64
           " chunk%s, %.2f MB of records stored in %.2f MB (ratio %.2f), %d classes\n",
           r.samples, o.name, o.split, o.out_dir, r.shards, r.shards == 1 ? "" : "s", r.chunks,
           r.chunks == 1 ? "" : "s", mb(r.raw_bytes), mb(r.bytes), r.bytes ? (double)r.raw_bytes / (double)r.bytes : 0,
           r.n_classes);
    return 0;
}

/* fusebox-data import text: files (or a built-in corpus) as byte-level token records. */
static int cmd_import_text(int argc, char **argv)
{
    static const struct option lo[] = {
        {"out", required_argument, NULL, 'o'},           {"name", required_argument, NULL, 'n'},
        {"split", required_argument, NULL, 's'},         {"context", required_argument, NULL, 'T'},
        {"stride", required_argument, NULL, 'S'},        {"builtin", required_argument, NULL, 'B'},
        {"builtin-dir", required_argument, NULL, 'D'},   {"level", required_argument, NULL, 'L'},
        {"chunk-records", required_argument, NULL, 'c'},
        {"shard-records", required_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    fb_import_opts o = {0};
    const char *builtin = NULL, *builtin_dir = NULL;
    int64_t context = 0, stride = 0, v;
    int opt;
    optind = 2;
    while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (opt) {
        case 'o': o.out_dir = optarg; break;
        case 'n': o.name = optarg; break;
        case 's': o.split = optarg; break;
        case 'B': builtin = optarg; break;
        case 'D': builtin_dir = optarg; break;
        case 'T':
            if (parse_i64(optarg, 1, FB_TEXT_MAX_CONTEXT, &context)) {
                fprintf(stderr, "fusebox-data: --context needs an integer in [1, %d]\n",
                        FB_TEXT_MAX_CONTEXT);
                return EXIT_USAGE;
            }
            break;
        case 'S':
            if (parse_i64(optarg, 1, FB_TEXT_MAX_STRIDE, &stride)) {
                fprintf(stderr, "fusebox-data: --stride needs an integer in [1, %" PRId64 "]\n",
                        FB_TEXT_MAX_STRIDE);
                return EXIT_USAGE;
            }
            break;
        case 'c':
            if (parse_i64(optarg, 1, FB_SHARD_MAX_CHUNK_RECORDS, &o.chunk_records)) {
                fprintf(stderr, "fusebox-data: --chunk-records needs an integer in [1, %" PRId64
                        "]\n", FB_SHARD_MAX_CHUNK_RECORDS);
                return EXIT_USAGE;
            }
            break;
        case 'r':
            if (parse_i64(optarg, 1, FB_SHARD_MAX_RECORDS, &o.shard_records)) {
                fprintf(stderr, "fusebox-data: --shard-records needs a positive integer\n");
                return EXIT_USAGE;
            }
            break;
        case 'L':
            if (parse_i64(optarg, -7, 19, &v) || v == 0) {
                fprintf(stderr, "fusebox-data: --level needs an integer in [-7, 19], not 0\n");
                return EXIT_USAGE;
            }
            o.level = (int)v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    int n_files = argc - optind;
    if (builtin ? n_files != 0 : n_files < 1) {
        fprintf(stderr, "fusebox-data import text: give text files or --builtin licenses, "
                        "not both\n");
        return EXIT_USAGE;
    }
    if (builtin_dir && !builtin) {
        fprintf(stderr, "fusebox-data import text: --builtin-dir is for --builtin\n");
        return EXIT_USAGE;
    }
    if (n_files > FB_TEXT_MAX_FILES) {
        fprintf(stderr, "fusebox-data import text: at most %d files\n", FB_TEXT_MAX_FILES);
        return EXIT_USAGE;
    }
    if (!context) {
        fprintf(stderr, "fusebox-data import text: --context is required\n");
        return EXIT_USAGE;
    }
    if (!o.out_dir || !o.name || !o.split) {
        fprintf(stderr, "fusebox-data import: --out, --name and --split are required\n");
        return EXIT_USAGE;
    }
    static char paths[FB_TEXT_MAX_FILES][FB_TEXT_PATH_MAX];
    const char *files[FB_TEXT_MAX_FILES];
    char msg[1024];
    int err = 0;
    if (builtin) {
        err = fb_datadir_builtin_text(paths, &n_files, builtin, builtin_dir, msg, sizeof msg);
        for (int i = 0; !err && i < n_files; i++) files[i] = paths[i];
    } else {
        for (int i = 0; i < n_files; i++) files[i] = argv[optind + i];
    }
    fb_import_result r;
    if (!err)
        err = fb_datadir_import_text(&r, &o, files, n_files, context, stride ? stride : context,
                                     msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-data: %s (%s)\n", msg, fb_err_code(err));
        return exit_for(err);
    }
    printf("imported %" PRId64 " records of %" PRId64 " tokens as %s/%s in %s: %" PRId64
           " shard%s, %" PRId64 " chunk%s, %.2f MB of records stored in %.2f MB, vocab %" PRId64
           ", no labels\n",
           r.samples, context + 1, o.name, o.split, o.out_dir, r.shards, r.shards == 1 ? "" : "s",
           r.chunks, r.chunks == 1 ? "" : "s", mb(r.raw_bytes), mb(r.bytes), r.vocab);
    return 0;
}

static int load_manifest(fb_manifest *m, const char *dir)
{
    char path[4200], msg[1024];
    snprintf(path, sizeof path, "%s/%s", dir, FB_MANIFEST_FILE);
    int err = fb_manifest_read(m, path, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "fusebox-data: %s (%s)\n", msg, fb_err_code(err));
        return EXIT_DATA;
    }
    return 0;
}

static void print_shape(const fb_manifest *m)
{
    if (m->ndim == 0) {
        printf("variable");
        return;
    }
    printf("[");
    for (int i = 0; i < m->ndim; i++) printf("%s%" PRId64, i ? ", " : "", m->shape[i]);
    printf("]");
}

static int cmd_inspect(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "usage: fusebox-data inspect DIR\n");
        return EXIT_USAGE;
    }
    const char *dir = argv[1];
    fb_manifest m;
    int rc = load_manifest(&m, dir);
    if (rc) return rc;
    printf("dataset   %s (%s)\n", m.name, dir);
    printf("format    %s version %d, shard format version %d\n", FB_MANIFEST_FORMAT,
           FB_MANIFEST_VERSION, FB_SHARD_VERSION);
    printf("samples   %s ", fb_data_dtype_name(m.dtype));
    print_shape(&m);
    if (m.vocab) printf(", token ids in [0, %" PRId64 ")", m.vocab);
    if (m.n_classes)
        printf(", labels int32 in [0, %d)\n", m.n_classes);
    else
        printf(", no labels\n");
    int bad = 0;
    for (int s = 0; s < m.n_splits; s++) {
        const fb_manifest_split *sp = &m.splits[s];
        uint64_t raw = 0, bytes = 0;
        int64_t chunks = 0;
        printf("\nsplit %s: %" PRId64 " samples in %d shard%s\n", sp->name, sp->samples,
               sp->n_shards, sp->n_shards == 1 ? "" : "s");
        printf("  %-32s %10s %8s %12s %12s %7s %9s\n", "shard", "records", "chunks", "bytes",
               "raw bytes", "ratio", "crc32c");
        for (int i = 0; i < sp->n_shards; i++) {
            const fb_manifest_shard *sh = &sp->shards[i];
            char path[4400], msg[1024];
            snprintf(path, sizeof path, "%s/%s", dir, sh->path);
            fb_shard_reader *r;
            int err = fb_shard_open(&r, path, msg, sizeof msg);
            if (err) {
                printf("  %-32s unreadable: %s (%s)\n", sh->path, msg, fb_err_code(err));
                bad = 1;
                continue;
            }
            const fb_shard_meta *mt = fb_shard_get_meta(r);
            printf("  %-32s %10" PRId64 " %8" PRId64 " %12" PRIu64 " %12" PRIu64 " %7.2f  %08" PRIx32
                   "\n", sh->path, mt->records, mt->chunks, mt->bytes, mt->raw_bytes,
                   (double)mt->raw_bytes / (double)mt->bytes, sh->crc32c);
            if (mt->bytes != sh->bytes || mt->records != sh->records || mt->chunks != sh->chunks) {
                printf("  %-32s disagrees with the manifest (%" PRIu64 " bytes, %" PRId64
                       " records, %" PRId64 " chunks listed)\n", "", sh->bytes, sh->records,
                       sh->chunks);
                bad = 1;
            }
            raw += mt->raw_bytes;
            bytes += mt->bytes;
            chunks += mt->chunks;
            fb_shard_close(r);
        }
        printf("  %-32s %10" PRId64 " %8" PRId64 " %12" PRIu64 " %12" PRIu64 " %7.2f\n", "total",
               sp->samples, chunks, bytes, raw, bytes ? (double)raw / (double)bytes : 0);
    }
    fb_manifest_free(&m);
    return bad ? EXIT_DATA : 0;
}

static int cmd_verify(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "usage: fusebox-data verify DIR\n");
        return EXIT_USAGE;
    }
    const char *dir = argv[1];
    fb_manifest m;
    int rc = load_manifest(&m, dir);
    if (rc) return rc;
    int bad = 0, shards = 0;
    int64_t records = 0, chunks = 0;
    uint64_t bytes = 0;
    for (int s = 0; s < m.n_splits; s++) {
        const fb_manifest_split *sp = &m.splits[s];
        for (int i = 0; i < sp->n_shards; i++) {
            char msg[1024];
            fb_verify_result vr;
            int err = fb_datadir_verify_shard(&vr, &m, dir, &sp->shards[i], msg, sizeof msg);
            shards++;
            if (err) {
                printf("FAILED %s: %s (%s)\n", sp->shards[i].path, msg, fb_err_code(err));
                fprintf(stderr, "fusebox-data: %s (%s)\n", msg, fb_err_code(err));
                bad++;
                continue;
            }
            printf("ok     %s: %" PRId64 " records, %" PRId64 " chunks, %" PRIu64 " bytes\n",
                   sp->shards[i].path, vr.records, vr.chunks, vr.bytes);
            records += vr.records;
            chunks += vr.chunks;
            bytes += vr.bytes;
        }
    }
    if (bad)
        printf("%d of %d shards FAILED verification\n", bad, shards);
    else
        printf("verified %s: %d shards, %" PRId64 " chunks, %" PRId64 " records, %.2f MB; every "
               "checksum matches\n", m.name, shards, chunks, records, mb(bytes));
    fb_manifest_free(&m);
    return bad ? EXIT_DATA : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("fusebox-data %s\n", FB_VERSION_STRING);
        return 0;
    }
    if (!strcmp(cmd, "import")) return cmd_import(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
    fprintf(stderr, "fusebox-data: unknown command \"%s\" (import, inspect, verify)\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}
