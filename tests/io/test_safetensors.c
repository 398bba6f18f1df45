/*
 * safetensors reader and writer: round trip, layout of the written file,
 * a check by an independent reader (Python's struct+json, and PyTorch
 * loading the tensors into nn.Sequential when available), a table of corrupt
 * files that must each be rejected with FB_ERR_CHECKPOINT, mutation and
 * truncation sweeps, and the atomic-replace behaviour of fb_st_write.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "safetensors.h"

static char g_dir[256];
static char g_msg[512];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    CHECK(buf != NULL);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void spit(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (len) CHECK(fwrite(buf, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

/* Counts entries of g_dir whose name contains ".tmp.". */
static int count_temp_files(void)
{
    DIR *d = opendir(g_dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* The reference tensors of the round trip. */
#define W_ROWS 3
#define W_COLS 4
static float ref_w[W_ROWS * W_COLS];
static float ref_b[W_ROWS];
static float ref_odd[3] = {1.5f, -2.25f, 1e-30f};
static int64_t ref_step = 1234567890123LL;
static int64_t ref_counts[5] = {-1, 0, 1, INT64_MAX, INT64_MIN};

static void fill_refs(void)
{
    for (int i = 0; i < W_ROWS * W_COLS; i++)
        ref_w[i] = 0.5f * (float)i - 1.0f;
    for (int i = 0; i < W_ROWS; i++)
        ref_b[i] = 0.125f * (float)(i + 1);
}

static void write_reference(const char *path)
{
    fb_st_writer *w = fb_st_writer_new();
    CHECK(w != NULL);
    int64_t sw[2] = {W_ROWS, W_COLS}, sb[1] = {W_ROWS}, sc[1] = {5}, so[1] = {3};
    int64_t se[2] = {0, 4};
    /* Added out of name order on purpose: the file must come out sorted. */
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "0.weight", sw, 2, ref_w, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_i64(w, "step", NULL, 0, &ref_step, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "0.bias", sb, 1, ref_b, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "odd", so, 1, ref_odd, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_i64(w, "counts", sc, 1, ref_counts, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "empty", se, 2, NULL, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_set_metadata(w, "format", "pt", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_set_metadata(w, "fusebox.step", "41", g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_writer_set_metadata(w, "fusebox.step", "42", g_msg, sizeof g_msg), 0);

    /* Invalid additions are refused and change nothing. */
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "0.bias", sb, 1, ref_b, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK(strstr(g_msg, "already") != NULL);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "", sb, 1, ref_b, g_msg, sizeof g_msg), FB_ERR_CHECKPOINT);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "__metadata__", sb, 1, ref_b, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "bad\xff", sb, 1, ref_b, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    int64_t neg[1] = {-3}, many[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "neg", neg, 1, ref_b, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK(strstr(g_msg, "negative") != NULL);
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "many", many, 9, ref_b, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK_INT_EQ(fb_st_writer_set_metadata(w, "k", "\xc0\x80", g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);

    CHECK_INT_EQ(fb_st_write(w, path, g_msg, sizeof g_msg), 0);
    fb_st_writer_free(w);
}

static void test_round_trip(const char *path)
{
    fb_st_file *f = NULL;
    int rc = fb_st_open(path, &f, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "fb_st_open: %s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    CHECK_INT_EQ(fb_st_count(f), 6);
    const char *names[6] = {"0.bias", "0.weight", "counts", "empty", "odd", "step"};
    for (size_t i = 0; i < 6; i++)
        CHECK_STR_EQ(fb_st_at(f, i)->name, names[i]);
    CHECK(fb_st_at(f, 6) == NULL);
    CHECK(fb_st_find(f, "nope") == NULL);

    const fb_st_tensor *t = fb_st_find(f, "0.weight");
    CHECK(t != NULL);
    CHECK_INT_EQ(t->dtype, FB_ST_F32);
    CHECK_INT_EQ(t->ndim, 2);
    CHECK_INT_EQ(t->shape[0], W_ROWS);
    CHECK_INT_EQ(t->shape[1], W_COLS);
    CHECK_INT_EQ(t->numel, W_ROWS * W_COLS);
    CHECK_INT_EQ(t->nbytes, 4 * W_ROWS * W_COLS);

    t = fb_st_find(f, "step");
    CHECK_INT_EQ(t->dtype, FB_ST_I64);
    CHECK_INT_EQ(t->ndim, 0);
    CHECK_INT_EQ(t->numel, 1);
    t = fb_st_find(f, "empty");
    CHECK_INT_EQ(t->numel, 0);
    CHECK_INT_EQ(t->nbytes, 0);

    float w[W_ROWS * W_COLS], b[W_ROWS], odd[3], none[1];
    int64_t sw[2] = {W_ROWS, W_COLS}, sb[1] = {W_ROWS}, so[1] = {3}, se[2] = {0, 4};
    CHECK_INT_EQ(fb_st_get_f32(f, "0.weight", sw, 2, w, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_get_f32(f, "0.bias", sb, 1, b, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_get_f32(f, "odd", so, 1, odd, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_get_f32(f, "empty", se, 2, none, g_msg, sizeof g_msg), 0);
    CHECK(memcmp(w, ref_w, sizeof w) == 0);
    CHECK(memcmp(b, ref_b, sizeof b) == 0);
    CHECK(memcmp(odd, ref_odd, sizeof odd) == 0);

    int64_t step = 0, counts[5], sc[1] = {5};
    CHECK_INT_EQ(fb_st_get_i64(f, "step", NULL, 0, &step, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(step, ref_step);
    CHECK_INT_EQ(fb_st_get_i64(f, "counts", sc, 1, counts, g_msg, sizeof g_msg), 0);
    CHECK(memcmp(counts, ref_counts, sizeof counts) == 0);

    /* Wrong shape, dtype or name: FB_ERR_CHECKPOINT, destination untouched. */
    float sentinel[W_ROWS * W_COLS];
    for (int i = 0; i < W_ROWS * W_COLS; i++)
        sentinel[i] = -777.0f;
    int64_t wrong[2] = {W_COLS, W_ROWS};
    CHECK_INT_EQ(fb_st_get_f32(f, "0.weight", wrong, 2, sentinel, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK(strstr(g_msg, "tensor 0.weight has shape [3, 4], expected [4, 3]") != NULL);
    CHECK_INT_EQ(fb_st_get_f32(f, "0.weight", sw, 1, sentinel, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK(strstr(g_msg, "expected [3]") != NULL);
    CHECK_INT_EQ(fb_st_get_f32(f, "counts", sc, 1, sentinel, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK(strstr(g_msg, "dtype I64") != NULL);
    CHECK_INT_EQ(fb_st_get_f32(f, "1.weight", sw, 2, sentinel, g_msg, sizeof g_msg),
                 FB_ERR_CHECKPOINT);
    CHECK(strstr(g_msg, "1.weight") != NULL && strstr(g_msg, "missing") != NULL);
    int64_t isent[3] = {-5, -5, -5};
    CHECK_INT_EQ(fb_st_get_i64(f, "odd", so, 1, isent, g_msg, sizeof g_msg), FB_ERR_CHECKPOINT);
    for (int i = 0; i < W_ROWS * W_COLS; i++)
        CHECK(sentinel[i] == -777.0f);
    CHECK(isent[0] == -5 && isent[2] == -5);

    CHECK_INT_EQ(fb_st_metadata_count(f), 2);
    CHECK_STR_EQ(fb_st_metadata_get(f, "format"), "pt");
    CHECK_STR_EQ(fb_st_metadata_get(f, "fusebox.step"), "42");
    CHECK(fb_st_metadata_get(f, "absent") == NULL);
    const char *k, *v;
    CHECK_INT_EQ(fb_st_metadata_at(f, 0, &k, &v), 0);
    CHECK_STR_EQ(k, "format");
    CHECK_INT_EQ(fb_st_metadata_at(f, 2, &k, &v), FB_ERR_NOT_FOUND);
    fb_st_close(f);
}

/* The bytes on disk follow the reference layout. */
static void test_layout(const char *path)
{
    size_t len;
    uint8_t *buf = slurp(path, &len);
    CHECK(len >= 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    CHECK_INT_EQ(hlen % 8, 0);
    CHECK(8 + hlen <= len);
    char *h = malloc(hlen + 1);
    CHECK(h != NULL);
    memcpy(h, buf + 8, hlen);
    h[hlen] = '\0';
    /* Sorted keys, compact separators, space padding only at the end. */
    CHECK(strncmp(h, "{\"0.bias\":{\"data_offsets\":[", 27) == 0);
    char *end = strrchr(h, '}');
    CHECK(end != NULL);
    for (char *p = end + 1; *p; p++)
        CHECK(*p == ' ');
    CHECK(strstr(h, "\"__metadata__\":{\"format\":\"pt\",\"fusebox.step\":\"42\"}") != NULL);
    CHECK(strstr(h, "\"step\":{\"data_offsets\":[") != NULL);
    CHECK(strstr(h, "\"dtype\":\"I64\",\"shape\":[]}") != NULL);
    free(h);

    /* Every tensor is aligned to its element size in the file: the data
     * section starts at 8 + hlen (a multiple of 8), and the lowest data
     * pointer is that start because the offsets tile it from 0. */
    fb_st_file *f = NULL;
    CHECK_INT_EQ(fb_st_parse_buffer(buf, len, &f, g_msg, sizeof g_msg), 0);
    const uint8_t *base = NULL;
    for (size_t i = 0; i < fb_st_count(f); i++)
        if (fb_st_at(f, i)->nbytes && (!base || fb_st_at(f, i)->data < base))
            base = fb_st_at(f, i)->data;
    CHECK(base != NULL);
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const fb_st_tensor *t = fb_st_at(f, i);
        if (t->nbytes) CHECK_INT_EQ((size_t)(t->data - base) % fb_st_dtype_size(t->dtype), 0);
    }
    CHECK(fb_st_find(f, "counts")->data == base); /* 8-byte elements come first */
    fb_st_close(f);
    free(buf);
}

static const char *py_check =
    "import json, struct, sys\n"
    "path, out = sys.argv[1], sys.argv[2]\n"
    "raw = open(path, 'rb').read()\n"
    "(n,) = struct.unpack('<Q', raw[:8])\n"
    "assert n % 8 == 0, n\n"
    "hdr = json.loads(raw[8:8 + n].decode('utf-8'))\n"
    "data = raw[8 + n:]\n"
    "meta = hdr.pop('__metadata__')\n"
    "assert meta == {'format': 'pt', 'fusebox.step': '42'}, meta\n"
    "assert sorted(hdr) == ['0.bias', '0.weight', 'counts', 'empty', 'odd', 'step'], hdr\n"
    "spans = sorted(tuple(e['data_offsets']) for e in hdr.values())\n"
    "pos = 0\n"
    "for b, e in spans:\n"
    "    assert b == pos, spans\n"
    "    pos = e\n"
    "assert pos == len(data), (pos, len(data))\n"
    "def get(name):\n"
    "    e = hdr[name]\n"
    "    b, end = e['data_offsets']\n"
    "    code = {'F32': 'f', 'I64': 'q'}[e['dtype']]\n"
    "    cnt = (end - b) // struct.calcsize(code)\n"
    "    return e['shape'], list(struct.unpack('<%d%s' % (cnt, code), data[b:end]))\n"
    "shape, w = get('0.weight')\n"
    "assert shape == [3, 4] and w == [0.5 * i - 1.0 for i in range(12)], (shape, w)\n"
    "assert get('0.bias') == ([3], [0.125, 0.25, 0.375])\n"
    "assert get('step') == ([], [1234567890123])\n"
    "assert get('counts') == ([5], [-1, 0, 1, 2**63 - 1, -2**63])\n"
    "assert get('empty') == ([0, 4], [])\n"
    "try:\n"
    "    import torch\n"
    "except ImportError:\n"
    "    torch = None\n"
    "if torch is not None:\n"
    "    dt = {'F32': torch.float32, 'I64': torch.int64}\n"
    "    sd = {}\n"
    "    for k, e in hdr.items():\n"
    "        b, end = e['data_offsets']\n"
    "        t = torch.frombuffer(bytearray(data[b:end]), dtype=dt[e['dtype']]) if end > b \\\n"
    "            else torch.empty(0, dtype=dt[e['dtype']])\n"
    "        sd[k] = t.reshape(e['shape'])\n"
    "    m = torch.nn.Sequential(torch.nn.Linear(4, 3))\n"
    "    m.load_state_dict({k: sd[k] for k in ('0.weight', '0.bias')}, strict=True)\n"
    "    y = m(torch.ones(1, 4))\n"
    "    want = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5 - 1.0\n"
    "    assert torch.equal(m[0].weight.data, want)\n"
    "    assert torch.allclose(y, want.sum(1) + torch.tensor([0.125, 0.25, 0.375]))\n"
    "    assert sd['step'].item() == 1234567890123 and sd['step'].dim() == 0\n"
    "# Write a file the way another writer might: unpadded header, F16/BF16/F64/I32.\n"
    "t = {'h': ('F16', [2, 2], struct.pack('<4H', 0x3C00, 0xC000, 0x0001, 0x7C00)),\n"
    "     'bf': ('BF16', [2], struct.pack('<2H', 0x3F80, 0x4040)),\n"
    "     'd': ('F64', [3], struct.pack('<3d', 0.1, -2.5, 1e300)),\n"
    "     'i': ('I32', [2], struct.pack('<2i', -7, 2**31 - 1))}\n"
    "hdr, blob = {}, b''\n"
    "for k in ('d', 'i', 'h', 'bf'):\n"
    "    dtype, shape, b = t[k]\n"
    "    hdr[k] = {'dtype': dtype, 'shape': shape, 'data_offsets': [len(blob), len(blob) + "
    "len(b)]}\n"
    "    blob += b\n"
    "hj = json.dumps(hdr).encode()\n"
    "open(out, 'wb').write(struct.pack('<Q', len(hj)) + hj + blob)\n"
    "print('python reader ok, torch', 'used' if torch is not None else 'absent')\n";

/* Reads the file the Python snippet wrote in another writer's style. */
static void check_foreign_file(const char *path)
{
    fb_st_file *f = NULL;
    int rc = fb_st_open(path, &f, g_msg, sizeof g_msg);
    if (rc) fprintf(stderr, "%s\n", g_msg);
    CHECK_INT_EQ(rc, 0);
    float h[4], bf[2], d[3];
    int64_t i[2];
    int64_t s22[2] = {2, 2}, s2[1] = {2}, s3[1] = {3};
    CHECK_INT_EQ(fb_st_get_f32(f, "h", s22, 2, h, g_msg, sizeof g_msg), 0);
    CHECK(h[0] == 1.0f && h[1] == -2.0f && h[2] == ldexpf(1.0f, -24) && isinf(h[3]));
    CHECK_INT_EQ(fb_st_get_f32(f, "bf", s2, 1, bf, g_msg, sizeof g_msg), 0);
    CHECK(bf[0] == 1.0f && bf[1] == 3.0f);
    CHECK_INT_EQ(fb_st_get_f32(f, "d", s3, 1, d, g_msg, sizeof g_msg), 0);
    CHECK(d[0] == 0.1f && d[1] == -2.5f && isinf(d[2]) && d[2] > 0);
    CHECK_INT_EQ(fb_st_get_i64(f, "i", s2, 1, i, g_msg, sizeof g_msg), 0);
    CHECK(i[0] == -7 && i[1] == INT32_MAX);
    CHECK_INT_EQ(fb_st_find(f, "h")->dtype, FB_ST_F16);
    fb_st_close(f);
}

/* Returns 1 when the Python part ran and passed, 0 when skipped. */
static int test_python(const char *path)
{
    if (access("/usr/bin/python3", X_OK) != 0) {
        fb_test_missing("python check: /usr/bin/python3 not found (apt-get install python3)");
        return 0;
    }
    char script[300], foreign[300], cmd[1024];
    path_in(script, sizeof script, "check.py");
    path_in(foreign, sizeof foreign, "foreign.safetensors");
    spit(script, py_check, strlen(py_check));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s'", script, path, foreign);
    fflush(stdout);
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK_INT_EQ(WEXITSTATUS(st), 0);
    check_foreign_file(foreign);
    unlink(script);
    unlink(foreign);
    return 1;
}

/* ------------------------------------------------------------ corruption */

/* A file: 8-byte little-endian hlen, then header text, then data_len zero bytes. */
static uint8_t *make_file(uint64_t hlen, const char *header, size_t data_len, size_t *len)
{
    size_t hl = strlen(header);
    *len = 8 + hl + data_len;
    uint8_t *buf = calloc(*len + 1, 1);
    CHECK(buf != NULL);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    return buf;
}

typedef struct bad_case {
    const char *what;
    const char *header; /* NULL: raw bytes below */
    size_t data_len;
    int64_t hlen; /* -1: strlen(header) */
    const char *raw;
    size_t raw_len;
    const char *expect; /* substring of the message */
} bad_case;

#define E(dt, shape, b, e)                                                                         \
    "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static const bad_case bad_cases[] = {
    {"empty file", NULL, 0, 0, "", 0, "too short"},
    {"7 bytes", NULL, 0, 0, "\x10\0\0\0\0\0\0", 7, "too short"},
    {"header length beyond file", "{}", 0, 100, NULL, 0, "past the end"},
    {"huge header length", "{}", 0, (int64_t)1 << 40, NULL, 0, "limit"},
    {"header just over 100 MB", "{}", 0, 100000001, NULL, 0, "limit"},
    {"zero header length", "", 0, -1, NULL, 0, "not valid JSON"},
    {"header not JSON", "{not json", 0, -1, NULL, 0, "not valid JSON"},
    {"header JSON array", "[1,2]", 0, -1, NULL, 0, "array"},
    {"trailing junk after JSON", "{} x", 0, -1, NULL, 0, "not valid JSON"},
    {"NUL in header", NULL, 0, 0, "\x04\0\0\0\0\0\0\0{}\0 ", 12, "not valid JSON"},
    {"invalid UTF-8 key", "{\"\xff\":" E("F32", "[1]", 0, 4) "}", 4, -1, NULL, 0, "JSON"},
    {"unknown dtype", "{\"a\":" E("F31", "[1]", 0, 4) "}", 4, -1, NULL, 0, "unknown dtype"},
    {"dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -1,
     NULL, 0, "dtype"},
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, -1, NULL, 0,
     "missing"},
    {"entry not an object", "{\"a\":[1,2]}", 0, -1, NULL, 0, "not a JSON object"},
    {"unknown entry field",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
     "\"x\":1}}",
     4, -1, NULL, 0, "unknown field"},
    {"shape/offset size mismatch", "{\"a\":" E("F32", "[2]", 0, 4) "}", 4, -1, NULL, 0,
     "needs 8 bytes"},
    {"scalar size mismatch", "{\"a\":" E("I64", "[]", 0, 4) "}", 4, -1, NULL, 0, "needs 8"},
    {"offsets out of range", "{\"a\":" E("F32", "[1]", 0, 4) "}", 0, -1, NULL, 0, "run past"},
    {"offsets end before begin", "{\"a\":" E("F32", "[0]", 4, 0) "}", 4, -1, NULL, 0, "end before"},
    {"offsets not a pair", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
     -1, NULL, 0, "data_offsets"},
    {"negative offset", "{\"a\":" E("F32", "[1]", -4, 0) "}", 4, -1, NULL, 0, "non-negative"},
    {"overlapping offsets", "{\"a\":" E("F32", "[2]", 0, 8) ",\"b\":" E("F32", "[2]", 4, 12) "}",
     12, -1, NULL, 0, "overlap"},
    {"hole in data", "{\"a\":" E("F32", "[1]", 0, 4) ",\"b\":" E("F32", "[1]", 8, 12) "}", 12, -1,
     NULL, 0, "belong to no tensor"},
    {"hole at the start", "{\"a\":" E("F32", "[1]", 4, 8) "}", 8, -1, NULL, 0,
     "belong to no tensor"},
    {"uncovered tail", "{\"a\":" E("F32", "[1]", 0, 4) "}", 8, -1, NULL, 0, "cover only"},
    {"data but no tensors", "{}", 8, -1, NULL, 0, "cover only"},
    {"negative dim", "{\"a\":" E("F32", "[-1]", 0, 0) "}", 0, -1, NULL, 0, "non-negative"},
    {"fractional dim", "{\"a\":" E("F32", "[1.5]", 0, 4) "}", 4, -1, NULL, 0, "non-negative"},
    {"too many dims", "{\"a\":" E("F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, -1, NULL, 0,
     "dimensions"},
    {"shape overflows", "{\"a\":" E("F32", "[4294967296,4294967296]", 0, 4) "}", 4, -1, NULL, 0,
     "overflow"},
    {"element bytes overflow", "{\"a\":" E("F64", "[4611686018427387904]", 0, 4) "}", 4, -1, NULL,
     0, "overflow"},
    {"integer too big for JSON", "{\"a\":" E("F32", "[99999999999999999999999]", 0, 4) "}", 4, -1,
     NULL, 0, "JSON"},
    {"duplicate key", "{\"a\":" E("F32", "[1]", 0, 4) ",\"a\":" E("F32", "[1]", 0, 4) "}", 4, -1,
     NULL, 0, "duplicate"},
    {"metadata not an object", "{\"__metadata__\":[]}", 0, -1, NULL, 0, "__metadata__"},
    {"metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0, -1, NULL, 0, "not a string"},
};

static void test_corruption(void)
{
    size_t n_cases = sizeof bad_cases / sizeof bad_cases[0];
    CHECK(n_cases >= 12);
    for (size_t i = 0; i < n_cases; i++) {
        const bad_case *c = &bad_cases[i];
        uint8_t *buf;
        size_t len;
        if (c->header) {
            uint64_t hlen = c->hlen < 0 ? strlen(c->header) : (uint64_t)c->hlen;
            buf = make_file(hlen, c->header, c->data_len, &len);
        } else {
            len = c->raw_len;
            buf = malloc(len + 1);
            CHECK(buf != NULL);
            memcpy(buf, c->raw, len);
        }
        fb_st_file *sentinel = (fb_st_file *)(uintptr_t)0x1234;
        fb_st_file *f = sentinel;
        g_msg[0] = '\0';
        int rc = fb_st_parse_buffer(buf, len, &f, g_msg, sizeof g_msg);
        printf("  %-30s -> %s: %s\n", c->what, fb_err_code(rc), g_msg);
        if (rc != FB_ERR_CHECKPOINT || !strstr(g_msg, c->expect)) {
            fprintf(stderr, "case \"%s\": rc %d, message \"%s\", expected \"%s\"\n", c->what, rc,
                    g_msg, c->expect);
            CHECK(0);
        }
        CHECK(f == sentinel);

        /* Same verdict through the file system. */
        char path[300];
        path_in(path, sizeof path, "bad.safetensors");
        spit(path, buf, len);
        g_msg[0] = '\0';
        CHECK_INT_EQ(fb_st_open(path, &f, g_msg, sizeof g_msg), FB_ERR_CHECKPOINT);
        CHECK(strstr(g_msg, path) != NULL);
        CHECK(f == sentinel);
        unlink(path);
        free(buf);
    }
    printf("corruption table: %zu cases rejected\n", n_cases);

    /* Sanity: the E() entries above are valid when consistent. */
    size_t len;
    uint8_t *ok = make_file(strlen("{\"a\":" E("F32", "[1]", 0, 4) "}"),
                            "{\"a\":" E("F32", "[1]", 0, 4) "}", 4, &len);
    fb_st_file *f = NULL;
    CHECK_INT_EQ(fb_st_parse_buffer(ok, len, &f, g_msg, sizeof g_msg), 0);
    fb_st_close(f);
    free(ok);
    /* An empty header object with no data is a valid, empty file. */
    ok = make_file(2, "{}", 0, &len);
    CHECK_INT_EQ(fb_st_parse_buffer(ok, len, &f, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_count(f), 0);
    fb_st_close(f);
    free(ok);
    /* Metadata null is accepted (the reference treats it as absent). */
    ok = make_file(strlen("{\"__metadata__\":null}"), "{\"__metadata__\":null}", 0, &len);
    CHECK_INT_EQ(fb_st_parse_buffer(ok, len, &f, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_metadata_count(f), 0);
    fb_st_close(f);
    free(ok);
}

/* Every strict prefix of a valid file is rejected; byte mutations of the
 * header never crash and never yield tensors outside the buffer. */
static void test_mutations(const char *path)
{
    size_t len;
    uint8_t *buf = slurp(path, &len);
    fb_st_file *f = NULL;
    for (size_t cut = 0; cut < len; cut++) {
        int rc = fb_st_parse_buffer(buf, cut, &f, g_msg, sizeof g_msg);
        if (rc != FB_ERR_CHECKPOINT) {
            fprintf(stderr, "prefix of %zu/%zu bytes: rc %d\n", cut, len, rc);
            CHECK(0);
        }
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    static const uint8_t vals[] = {0x00, 0x01, '"', ',', '9', '-', '[', '}', 0x7f, 0xff};
    size_t accepted = 0, total = 0;
    uint8_t *m = malloc(len);
    CHECK(m != NULL);
    for (size_t pos = 0; pos < 8 + hlen; pos++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(m, buf, len);
            if (m[pos] == vals[v]) continue;
            m[pos] = vals[v];
            total++;
            int rc = fb_st_parse_buffer(m, len, &f, g_msg, sizeof g_msg);
            if (rc == 0) {
                accepted++;
                for (size_t i = 0; i < fb_st_count(f); i++) {
                    const fb_st_tensor *t = fb_st_at(f, i);
                    CHECK(t->nbytes == (size_t)t->numel * fb_st_dtype_size(t->dtype));
                }
                fb_st_close(f);
            } else {
                CHECK_INT_EQ(rc, FB_ERR_CHECKPOINT);
                CHECK(g_msg[0] != '\0');
            }
        }
    }
    printf("mutations: %zu tried, %zu still valid (e.g. metadata text)\n", total, accepted);
    free(m);
    free(buf);
}

/* ------------------------------------------------------------ atomic write */

static void test_atomic(void)
{
    char path[300];
    path_in(path, sizeof path, "model.safetensors");
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    int64_t sa[1] = {2}, sb[1] = {3};

    fb_st_writer *w = fb_st_writer_new();
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "a", sa, 1, a, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_write(w, path, g_msg, sizeof g_msg), 0);
    fb_st_writer_free(w);
    CHECK_INT_EQ(count_temp_files(), 0);

    /* A second write replaces the file as a whole. */
    w = fb_st_writer_new();
    CHECK_INT_EQ(fb_st_writer_add_f32(w, "b", sb, 1, b, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_write(w, path, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(count_temp_files(), 0);
    fb_st_file *f = NULL;
    CHECK_INT_EQ(fb_st_open(path, &f, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_count(f), 1);
    CHECK(fb_st_find(f, "a") == NULL);
    float got[3];
    CHECK_INT_EQ(fb_st_get_f32(f, "b", sb, 1, got, g_msg, sizeof g_msg), 0);
    CHECK(memcmp(got, b, sizeof b) == 0);
    fb_st_close(f);

    /* A failed write (missing directory) is FB_ERR_IO and leaves nothing. */
    char bad[300];
    path_in(bad, sizeof bad, "no-such-dir/model.safetensors");
    CHECK_INT_EQ(fb_st_write(w, bad, g_msg, sizeof g_msg), FB_ERR_IO);
    CHECK(strstr(g_msg, "no-such-dir") != NULL);
    CHECK_INT_EQ(count_temp_files(), 0);

    /* Writing over a directory fails at rename; the temp file is removed. */
    char sub[300];
    path_in(sub, sizeof sub, "a-directory");
    CHECK(mkdir(sub, 0755) == 0);
    CHECK_INT_EQ(fb_st_write(w, sub, g_msg, sizeof g_msg), FB_ERR_IO);
    CHECK_INT_EQ(count_temp_files(), 0);
    CHECK(rmdir(sub) == 0);

    /* A relative path (directory ".") works too. */
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(g_dir) == 0);
    CHECK_INT_EQ(fb_st_write(w, "rel.safetensors", g_msg, sizeof g_msg), 0);
    CHECK(chdir(cwd) == 0);
    CHECK_INT_EQ(count_temp_files(), 0);
    char rel[300];
    path_in(rel, sizeof rel, "rel.safetensors");
    CHECK(unlink(rel) == 0);
    fb_st_writer_free(w);

    /* An empty writer writes a valid empty file. */
    w = fb_st_writer_new();
    CHECK_INT_EQ(fb_st_write(w, path, g_msg, sizeof g_msg), 0);
    fb_st_writer_free(w);
    CHECK_INT_EQ(fb_st_open(path, &f, g_msg, sizeof g_msg), 0);
    CHECK_INT_EQ(fb_st_count(f), 0);
    fb_st_close(f);
    CHECK(unlink(path) == 0);

    /* Missing input file: an OS error. */
    CHECK_INT_EQ(fb_st_open(path, &f, g_msg, sizeof g_msg), FB_ERR_IO);
    CHECK(strstr(g_msg, path) != NULL);
    CHECK_INT_EQ(fb_st_open(g_dir, &f, g_msg, sizeof g_msg), FB_ERR_IO);

    fb_st_close(NULL);
    fb_st_writer_free(NULL);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep order with stderr in logs */
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fb_test_st.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(g_dir) != NULL);
    fill_refs();

    char path[300];
    path_in(path, sizeof path, "ref.safetensors");
    write_reference(path);
    CHECK_INT_EQ(count_temp_files(), 0);
    test_round_trip(path);
    test_layout(path);
    int py = test_python(path);
    test_corruption();
    test_mutations(path);
    unlink(path);
    test_atomic();

    CHECK(rmdir(g_dir) == 0);
    printf("test_safetensors: ok%s\n", py ? "" : " (python part skipped)");
    return 0;
}
