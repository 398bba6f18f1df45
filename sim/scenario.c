/*
 * Scenario files: JSON lines, one record per line, read with Jansson.  Every
 * field is checked against its bounds and every error names the file and
 * line.  A record that fails leaves the scenario as it was before it.
 */
#include "sim.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#define GIB 1073741824.0
#define MAX_LINE (1 << 20)
#define MAX_FILE (INT64_C(1) << 30)
#define MAX_DEVICES 1000000
#define MAX_JOBS 10000000
#define UNLIMITED_DEVICES (1 << 30)

sim_config sim_config_default(void)
{
    return (sim_config){.period_s = 5.0,
                        .plan_gap_s = 1.0,
                        .max_b = 8,
                        .max_groups_per_device = 4,
                        .switch_overhead = 0.02,
                        .rebalance = true,
                        .migrate = false,
                        .migrate_cost_s = 30.0,
                        .dispatch_s = 0.0,
                        .fair = fb_fair_params_default()};
}

/* ---- growing arrays ------------------------------------------------------------ */

static int grow(void **p, int *cap, int need, size_t size)
{
    if (need <= *cap) return 0;
    int n = *cap ? *cap : 16;
    while (n < need) {
        if (n > INT_MAX / 2) return -1;
        n *= 2;
    }
    void *q = realloc(*p, (size_t)n * size);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* Capacities live beside the scenario, not in it: a reader's own state. */
typedef struct reader {
    sim_scenario *sc;
    const char *file;
    int line;
    char *msg;
    size_t cap;
    int cap_profiles, cap_tenants, cap_jobs, cap_keys, cap_devspecs, cap_mixes, cap_hosts;
} reader;

#define FAIL(r, ...) fail_at(r, __VA_ARGS__)

__attribute__((format(printf, 2, 3))) static int fail_at(reader *r, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fb_errf(r->msg, r->cap, FB_ERR_OUT_OF_RANGE, "%s:%d: %s", r->file, r->line, what);
}

/* ---- fields ------------------------------------------------------------------------ */

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > SIM_NAME_MAX || !isalnum((unsigned char)s[0])) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

/* Refuses fields not in allowed (a NULL-terminated list). */
static int check_fields(reader *r, json_t *o, const char *type, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool ok = strcmp(k, "type") == 0;
        for (int i = 0; !ok && allowed[i]; i++)
            ok = strcmp(k, allowed[i]) == 0;
        if (!ok) return FAIL(r, "unknown field \"%s\" in a %s record", k, type);
    }
    return 0;
}

static int get_num(reader *r, json_t *o, const char *k, bool required, double lo, double hi,
                   double *out)
{
    json_t *v = json_object_get(o, k);
    if (!v) return required ? FAIL(r, "missing field \"%s\"", k) : 0;
    if (!json_is_number(v)) return FAIL(r, "field \"%s\" must be a number", k);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return FAIL(r, "field \"%s\" = %g is outside %g..%g", k, x, lo, hi);
    *out = x;
    return 0;
}

static int get_int(reader *r, json_t *o, const char *k, bool required, int64_t lo, int64_t hi,
                   int64_t *out)
{
    json_t *v = json_object_get(o, k);
    if (!v) return required ? FAIL(r, "missing field \"%s\"", k) : 0;
    if (!json_is_integer(v)) return FAIL(r, "field \"%s\" must be an integer", k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return FAIL(r, "field \"%s\" = %lld is outside %lld..%lld", k, (long long)x, (long long)lo,
                    (long long)hi);
    *out = (int64_t)x;
    return 0;
}

static int get_int32(reader *r, json_t *o, const char *k, bool required, int lo, int hi, int *out)
{
    int64_t v = *out;
    int rc = get_int(r, o, k, required, lo, hi, &v);
    if (!rc) *out = (int)v;
    return rc;
}

static int get_bool(reader *r, json_t *o, const char *k, bool *out)
{
    json_t *v = json_object_get(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return FAIL(r, "field \"%s\" must be true or false", k);
    *out = json_is_true(v);
    return 0;
}

/* A name field: the string itself, checked. */
static int get_name(reader *r, json_t *o, const char *k, bool required, const char **out)
{
    json_t *v = json_object_get(o, k);
    if (!v) return required ? FAIL(r, "missing field \"%s\"", k) : 0;
    if (!json_is_string(v)) return FAIL(r, "field \"%s\" must be a string", k);
    const char *s = json_string_value(v);
    if (!name_ok(s))
        return FAIL(r,
                    "field \"%s\" = \"%.80s\" is not a name (1 to 64 of A-Z a-z 0-9 . _ -, "
                    "starting with a letter or digit)",
                    k, s);
    *out = s;
    return 0;
}

static int get_kind(reader *r, json_t *o, int *out)
{
    json_t *v = json_object_get(o, "kind");
    if (!v) return 0;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(s, "cuda") == 0)
        *out = FB_PLAN_CUDA;
    else if (strcmp(s, "cpu") == 0)
        *out = FB_PLAN_CPU;
    else
        return FAIL(r, "field \"kind\" must be \"cuda\" or \"cpu\"");
    return 0;
}

/* [min, max] of integers within lo..hi, min <= max. */
static int get_range(reader *r, json_t *o, const char *k, bool required, int64_t lo, int64_t hi,
                     int64_t *min, int64_t *max)
{
    json_t *v = json_object_get(o, k);
    if (!v) return required ? FAIL(r, "missing field \"%s\"", k) : 0;
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)))
        return FAIL(r, "field \"%s\" must be [min, max] of integers", k);
    json_int_t a = json_integer_value(json_array_get(v, 0)),
               b = json_integer_value(json_array_get(v, 1));
    if (a < lo || b > hi || a > b)
        return FAIL(r, "field \"%s\" = [%lld, %lld] must have %lld <= min <= max <= %lld", k,
                    (long long)a, (long long)b, (long long)lo, (long long)hi);
    *min = a;
    *max = b;
    return 0;
}

static int find_profile(const sim_scenario *sc, const char *name)
{
    for (int i = 0; i < sc->n_profiles; i++)
        if (strcmp(sc->profiles[i].name, name) == 0) return i;
    return -1;
}

static int find_tenant(const sim_scenario *sc, const char *name)
{
    for (int i = 0; i < sc->n_tenants; i++)
        if (strcmp(sc->tenants[i].name, name) == 0) return i;
    return -1;
}

static int find_host(const sim_scenario *sc, const char *name)
{
    for (int i = 0; i < sc->n_hosts; i++)
        if (strcmp(sc->hosts[i].name, name) == 0) return i;
    return -1;
}

/* ---- records ------------------------------------------------------------------------ */

static int rec_sim(reader *r, json_t *o)
{
    static const char *const f[] = {"name",
                                    "period_s",
                                    "plan_gap_s",
                                    "max_b",
                                    "max_groups_per_device",
                                    "switch_overhead",
                                    "switch_overhead_step",
                                    "rebalance",
                                    "migrate",
                                    "migrate_cost_s",
                                    "dispatch_s",
                                    "split_hysteresis",
                                    "split_patience",
                                    "share_hysteresis",
                                    "max_share_step",
                                    "min_share",
                                    "migrate_gap",
                                    "migrate_patience",
                                    NULL};
    int rc = check_fields(r, o, "sim", f);
    sim_config c = r->sc->cfg;
    const char *name = NULL;
    if (rc || (rc = get_name(r, o, "name", false, &name)) ||
        (rc = get_num(r, o, "period_s", false, 0.01, 86400, &c.period_s)) ||
        (rc = get_num(r, o, "plan_gap_s", false, 0, 86400, &c.plan_gap_s)) ||
        (rc = get_int32(r, o, "max_b", false, 1, 1024, &c.max_b)) ||
        (rc = get_int32(r, o, "max_groups_per_device", false, 1, 64, &c.max_groups_per_device)) ||
        (rc = get_num(r, o, "switch_overhead", false, 0, 0.5, &c.switch_overhead)) ||
        (rc = get_num(r, o, "switch_overhead_step", false, 0, 0.5, &c.switch_overhead_step)) ||
        (rc = get_bool(r, o, "rebalance", &c.rebalance)) ||
        (rc = get_bool(r, o, "migrate", &c.migrate)) ||
        (rc = get_num(r, o, "migrate_cost_s", false, 0, 86400, &c.migrate_cost_s)) ||
        (rc = get_num(r, o, "dispatch_s", false, 0, 86400, &c.dispatch_s)) ||
        (rc = get_num(r, o, "split_hysteresis", false, 0, 0.99, &c.fair.split_hysteresis)) ||
        (rc = get_int32(r, o, "split_patience", false, 1, 100000, &c.fair.split_patience)) ||
        (rc = get_num(r, o, "share_hysteresis", false, 0, 0.99, &c.fair.share_hysteresis)) ||
        (rc = get_num(r, o, "max_share_step", false, 0.001, 1, &c.fair.max_share_step)) ||
        (rc = get_num(r, o, "min_share", false, 0.001, 1, &c.fair.min_share)) ||
        (rc = get_int32(r, o, "migrate_gap", false, 1, 64, &c.fair.migrate_gap)) ||
        (rc = get_int32(r, o, "migrate_patience", false, 1, 100000, &c.fair.migrate_patience)))
        return rc;
    c.fair.period_s = c.period_s;
    r->sc->cfg = c;
    if (name) snprintf(r->sc->name, sizeof r->sc->name, "%s", name);
    return 0;
}

/* The speeds field: one speed per device of a worker, each 0.01..100. */
static int get_speeds(reader *r, json_t *o, sim_devspec *d)
{
    json_t *v = json_object_get(o, "speeds");
    if (!v) return 0;
    if (json_object_get(o, "speed"))
        return FAIL(r, "fields \"speed\" and \"speeds\" exclude each other");
    if (!json_is_array(v) || (int)json_array_size(v) != d->per_worker)
        return FAIL(r, "field \"speeds\" must be an array of per_worker = %d numbers",
                    d->per_worker);
    for (int i = 0; i < d->per_worker; i++) {
        json_t *x = json_array_get(v, (size_t)i);
        double s = json_is_number(x) ? json_number_value(x) : 0.0;
        if (!(s >= 0.01 && s <= 100))
            return FAIL(r, "field \"speeds\"[%d] must be a number within 0.01..100", i);
        d->speeds[i] = s;
    }
    d->n_speeds = d->per_worker;
    return 0;
}

static int rec_devices(reader *r, json_t *o)
{
    static const char *const f[] = {"count",  "per_worker", "kind", "speed",
                                    "speeds", "memory_gib", "host", NULL};
    sim_devspec d = {.count = 1, .per_worker = 4, .kind = FB_PLAN_CUDA, .speed = 1.0, .host = -1};
    double mem = 80.0;
    const char *host = NULL;
    int rc = check_fields(r, o, "devices", f);
    if (rc || (rc = get_int32(r, o, "count", true, 1, MAX_DEVICES, &d.count)) ||
        (rc = get_int32(r, o, "per_worker", false, 1, FB_PLAN_MAX_GROUP_DEVICES, &d.per_worker)) ||
        (rc = get_kind(r, o, &d.kind)) ||
        (rc = get_num(r, o, "speed", false, 0.01, 100, &d.speed)) || (rc = get_speeds(r, o, &d)) ||
        (rc = get_num(r, o, "memory_gib", false, 0.001, 1e6, &mem)) ||
        (rc = get_name(r, o, "host", false, &host)))
        return rc;
    if (host && (d.host = find_host(r->sc, host)) < 0)
        return FAIL(r, "host \"%s\" is not defined (define it on an earlier line)", host);
    int64_t total = d.count;
    for (int i = 0; i < r->sc->n_devspecs; i++)
        total += r->sc->devspecs[i].count;
    if (total > MAX_DEVICES) return FAIL(r, "more than %d devices in all", MAX_DEVICES);
    d.memory_bytes = (int64_t)(mem * GIB);
    if (grow((void **)&r->sc->devspecs, &r->cap_devspecs, r->sc->n_devspecs + 1, sizeof d))
        return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
    r->sc->devspecs[r->sc->n_devspecs++] = d;
    return 0;
}

static int rec_tenant(reader *r, json_t *o)
{
    static const char *const f[] = {"name", "weight", "share_arrays", "max_devices", NULL};
    sim_tenant t = {.weight = 1.0, .max_devices = UNLIMITED_DEVICES};
    const char *name = NULL;
    int rc = check_fields(r, o, "tenant", f);
    if (rc || (rc = get_name(r, o, "name", true, &name)) ||
        (rc = get_num(r, o, "weight", false, 1e-3, 1e6, &t.weight)) ||
        (rc = get_bool(r, o, "share_arrays", &t.share_arrays)) ||
        (rc = get_int32(r, o, "max_devices", false, 0, UNLIMITED_DEVICES, &t.max_devices)))
        return rc;
    if (find_tenant(r->sc, name) >= 0) return FAIL(r, "tenant \"%s\" is defined twice", name);
    snprintf(t.name, sizeof t.name, "%s", name);
    if (grow((void **)&r->sc->tenants, &r->cap_tenants, r->sc->n_tenants + 1, sizeof t))
        return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
    r->sc->tenants[r->sc->n_tenants++] = t;
    return 0;
}

/* A host record: cores and the step-time inflation of its busy devices. */
static int rec_host(reader *r, json_t *o)
{
    static const char *const f[] = {"name", "cores", "interference", NULL};
    sim_host h = {.cores = 1};
    const char *name = NULL;
    int rc = check_fields(r, o, "host", f);
    if (rc || (rc = get_name(r, o, "name", true, &name)) ||
        (rc = get_int32(r, o, "cores", true, 1, 1 << 20, &h.cores)) ||
        (rc = get_num(r, o, "interference", false, 0, 10, &h.interference)))
        return rc;
    if (find_host(r->sc, name) >= 0) return FAIL(r, "host \"%s\" is defined twice", name);
    snprintf(h.name, sizeof h.name, "%s", name);
    if (grow((void **)&r->sc->hosts, &r->cap_hosts, r->sc->n_hosts + 1, sizeof h))
        return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
    r->sc->hosts[r->sc->n_hosts++] = h;
    return 0;
}

static int rec_profile(reader *r, json_t *o)
{
    static const char *const f[] = {
        "name",       "step_s", "alpha",   "batch",          "data",  "kind",       "member_gib",
        "shared_gib", "public", "start_s", "start_member_s", "end_s", "isolated_s", NULL};
    sim_profile p = {.alpha = 0.3, .batch = 128, .data = 1, .kind = FB_PLAN_CUDA};
    double member = 1.0, shared = 0.1;
    const char *name = NULL;
    int rc = check_fields(r, o, "profile", f);
    if (rc || (rc = get_name(r, o, "name", true, &name)) ||
        (rc = get_num(r, o, "step_s", true, 1e-6, 1e6, &p.step_s)) ||
        (rc = get_num(r, o, "alpha", false, 0, 1, &p.alpha)) ||
        (rc = get_int(r, o, "batch", false, 1, INT64_C(1) << 20, &p.batch)) ||
        (rc = get_int32(r, o, "data", false, 1, FB_PLAN_MAX_GROUP_DEVICES, &p.data)) ||
        (rc = get_kind(r, o, &p.kind)) ||
        (rc = get_num(r, o, "member_gib", false, 0, 1e6, &member)) ||
        (rc = get_num(r, o, "shared_gib", false, 0, 1e6, &shared)) ||
        (rc = get_bool(r, o, "public", &p.public_dataset)) ||
        (rc = get_num(r, o, "start_s", false, 0, 1e6, &p.start_s)) ||
        (rc = get_num(r, o, "start_member_s", false, 0, 1e6, &p.start_member_s)) ||
        (rc = get_num(r, o, "end_s", false, 0, 1e6, &p.end_s)) ||
        (rc = get_num(r, o, "isolated_s", false, 0, 1e6, &p.isolated_s)))
        return rc;
    if (p.batch < p.data)
        return FAIL(r, "batch %lld is smaller than data = %d shards", (long long)p.batch, p.data);
    if (find_profile(r->sc, name) >= 0) return FAIL(r, "profile \"%s\" is defined twice", name);
    snprintf(p.name, sizeof p.name, "%s", name);
    p.member_bytes = (int64_t)(member * GIB);
    p.shared_bytes = (int64_t)(shared * GIB);
    if (grow((void **)&r->sc->profiles, &r->cap_profiles, r->sc->n_profiles + 1, sizeof p))
        return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
    r->sc->profiles[r->sc->n_profiles++] = p;
    return 0;
}

/* The index of key name for profile, added when new; -1 (msg filled) when
 * the key belongs to another profile or memory runs out. */
static int key_index(reader *r, const char *name, int profile)
{
    sim_scenario *sc = r->sc;
    for (int i = 0; i < sc->n_keys; i++) {
        if (strcmp(sc->keys[i], name) != 0) continue;
        if (sc->key_profile[i] != profile) {
            FAIL(r, "key \"%s\" belongs to profile \"%s\", not \"%s\"", name,
                 sc->profiles[sc->key_profile[i]].name, sc->profiles[profile].name);
            return -1;
        }
        return i;
    }
    int cap = r->cap_keys;
    if (grow((void **)&sc->keys, &cap, sc->n_keys + 1, sizeof *sc->keys) ||
        grow((void **)&sc->key_profile, &r->cap_keys, sc->n_keys + 1, sizeof *sc->key_profile)) {
        fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
        return -1;
    }
    char *copy = strdup(name);
    if (!copy) {
        fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
        return -1;
    }
    sc->keys[sc->n_keys] = copy;
    sc->key_profile[sc->n_keys] = profile;
    return sc->n_keys++;
}

static int add_job(reader *r, const sim_job *j)
{
    if (r->sc->n_jobs >= MAX_JOBS) return FAIL(r, "more than %d jobs", MAX_JOBS);
    if (grow((void **)&r->sc->jobs, &r->cap_jobs, r->sc->n_jobs + 1, sizeof *j))
        return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
    r->sc->jobs[r->sc->n_jobs++] = *j;
    return 0;
}

static int rec_job(reader *r, json_t *o)
{
    static const char *const f[] = {"at", "tenant", "profile", "steps", "key", "priority", NULL};
    sim_job j = {.priority = 50};
    const char *tenant = NULL, *profile = NULL, *key = NULL;
    int rc = check_fields(r, o, "job", f);
    if (rc || (rc = get_num(r, o, "at", true, 0, 1e9, &j.at)) ||
        (rc = get_name(r, o, "tenant", true, &tenant)) ||
        (rc = get_name(r, o, "profile", true, &profile)) ||
        (rc = get_int(r, o, "steps", true, 1, INT64_C(1000000000), &j.steps)) ||
        (rc = get_name(r, o, "key", false, &key)) ||
        (rc = get_int32(r, o, "priority", false, 0, 100, &j.priority)))
        return rc;
    if ((j.tenant = find_tenant(r->sc, tenant)) < 0)
        return FAIL(r, "tenant \"%s\" is not defined (define it on an earlier line)", tenant);
    if ((j.profile = find_profile(r->sc, profile)) < 0)
        return FAIL(r, "profile \"%s\" is not defined (define it on an earlier line)", profile);
    if (r->sc->n_jobs >= MAX_JOBS) return FAIL(r, "more than %d jobs", MAX_JOBS);
    /* a job without a key fuses with nobody: its own key, which no name can
     * spell because names cannot start with '#' */
    char own[32];
    if (!key) {
        snprintf(own, sizeof own, "#job%d", r->sc->n_jobs);
        key = own;
    }
    if ((j.key = key_index(r, key, j.profile)) < 0) return FB_ERR_OUT_OF_RANGE;
    return add_job(r, &j);
}

static int rec_generate(reader *r, json_t *o)
{
    static const char *const f[] = {"jobs", "rate_per_s", "seed", "start_s", NULL};
    sim_generator g = {.on = true};
    int64_t seed = 1;
    int rc = check_fields(r, o, "generate", f);
    if (rc || (rc = get_int32(r, o, "jobs", true, 1, MAX_JOBS, &g.jobs)) ||
        (rc = get_num(r, o, "rate_per_s", true, 1e-9, 1e6, &g.rate_per_s)) ||
        (rc = get_int(r, o, "seed", false, 0, INT64_MAX, &seed)) ||
        (rc = get_num(r, o, "start_s", false, 0, 1e9, &g.start_s)))
        return rc;
    if (r->sc->gen.on) return FAIL(r, "a second generate record (one generator per scenario)");
    g.seed = (uint64_t)seed;
    r->sc->gen = g;
    return 0;
}

static int rec_mix(reader *r, json_t *o)
{
    static const char *const f[] = {"profile",  "weight",  "sweep", "steps",
                                    "priority", "tenants", NULL};
    sim_mix m = {.weight = 1.0, .sweep_min = 1, .sweep_max = 1, .priority = 50};
    const char *profile = NULL;
    int64_t smin = 1, smax = 1;
    int rc = check_fields(r, o, "mix", f);
    if (rc || (rc = get_name(r, o, "profile", true, &profile)) ||
        (rc = get_num(r, o, "weight", false, 1e-9, 1e9, &m.weight)) ||
        (rc = get_range(r, o, "sweep", false, 1, 10000, &smin, &smax)) ||
        (rc = get_range(r, o, "steps", true, 1, INT64_C(1000000000), &m.steps_min, &m.steps_max)) ||
        (rc = get_int32(r, o, "priority", false, 0, 100, &m.priority)))
        return rc;
    m.sweep_min = (int)smin;
    m.sweep_max = (int)smax;
    if ((m.profile = find_profile(r->sc, profile)) < 0)
        return FAIL(r, "profile \"%s\" is not defined (define it on an earlier line)", profile);
    json_t *tl = json_object_get(o, "tenants");
    if (tl) {
        if (!json_is_array(tl) || json_array_size(tl) < 1 || json_array_size(tl) > 100000)
            return FAIL(r, "field \"tenants\" must be a list of 1 to 100000 tenant names");
        m.n_tenants = (int)json_array_size(tl);
        m.tenants = malloc((size_t)m.n_tenants * sizeof *m.tenants);
        if (!m.tenants) return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
        for (int i = 0; i < m.n_tenants; i++) {
            json_t *v = json_array_get(tl, (size_t)i);
            int t = json_is_string(v) ? find_tenant(r->sc, json_string_value(v)) : -1;
            if (t < 0) {
                free(m.tenants);
                return FAIL(r, "tenants[%d] is not a defined tenant", i);
            }
            m.tenants[i] = t;
        }
    }
    if (grow((void **)&r->sc->mixes, &r->cap_mixes, r->sc->n_mixes + 1, sizeof m)) {
        free(m.tenants);
        return fb_errf(r->msg, r->cap, FB_ERR_NOMEM, "out of memory");
    }
    r->sc->mixes[r->sc->n_mixes++] = m;
    return 0;
}

static int record(reader *r, const char *text, size_t len)
{
    json_error_t e;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!o) return FAIL(r, "not JSON: %s (column %d)", e.text, e.column);
    int rc;
    json_t *type = json_object_get(o, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : NULL;
    if (!json_is_object(o))
        rc = FAIL(r, "a record must be a JSON object");
    else if (!t)
        rc = FAIL(r, "missing field \"type\" (a string)");
    else if (strcmp(t, "sim") == 0)
        rc = rec_sim(r, o);
    else if (strcmp(t, "devices") == 0)
        rc = rec_devices(r, o);
    else if (strcmp(t, "tenant") == 0)
        rc = rec_tenant(r, o);
    else if (strcmp(t, "host") == 0)
        rc = rec_host(r, o);
    else if (strcmp(t, "profile") == 0)
        rc = rec_profile(r, o);
    else if (strcmp(t, "job") == 0)
        rc = rec_job(r, o);
    else if (strcmp(t, "generate") == 0)
        rc = rec_generate(r, o);
    else if (strcmp(t, "mix") == 0)
        rc = rec_mix(r, o);
    else
        rc = FAIL(r,
                  "unknown record type \"%.40s\" (sim, host, devices, tenant, profile, job, "
                  "generate, mix)",
                  t);
    json_decref(o);
    return rc;
}

int sim_scenario_read_text(sim_scenario *sc, const char *text, const char *name, char *msg,
                           size_t msg_cap)
{
    if (sc->finished)
        return fb_errf(msg, msg_cap, FB_ERR_STATE_CONFLICT, "%s: the scenario is already finished",
                       name);
    if (sc->cfg.period_s == 0.0) { /* a zeroed scenario: its first file */
        sc->cfg = sim_config_default();
        snprintf(sc->name, sizeof sc->name, "%s", "scenario");
    }
    reader r = {.sc = sc, .file = name, .msg = msg, .cap = msg_cap};
    /* the capacities of arrays grown by earlier files are their lengths */
    r.cap_profiles = sc->n_profiles;
    r.cap_tenants = sc->n_tenants;
    r.cap_jobs = sc->n_jobs;
    r.cap_keys = sc->n_keys;
    r.cap_devspecs = sc->n_devspecs;
    r.cap_mixes = sc->n_mixes;
    r.cap_hosts = sc->n_hosts;
    const char *p = text;
    while (*p) {
        r.line++;
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > MAX_LINE) return FAIL(&r, "line longer than %d bytes", MAX_LINE);
        size_t i = 0;
        while (i < len && isspace((unsigned char)p[i]))
            i++;
        if (i < len && p[i] != '#') {
            int rc = record(&r, p, len);
            if (rc) return rc;
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

int sim_scenario_read(sim_scenario *sc, const char *path, char *msg, size_t msg_cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fb_errf(msg, msg_cap, FB_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, alloc = 0;
    int rc = 0;
    for (;;) {
        if (len + 65536 + 1 > alloc) {
            alloc = alloc ? alloc * 2 : 131072;
            if ((int64_t)alloc > MAX_FILE) {
                rc = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: larger than 1 GiB", path);
                break;
            }
            char *q = realloc(buf, alloc);
            if (!q) {
                rc = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = q;
        }
        size_t n = fread(buf + len, 1, 65536, f);
        len += n;
        if (n < 65536) {
            if (ferror(f)) rc = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (!rc) {
        buf[len] = '\0';
        if (strlen(buf) != len)
            rc = fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "%s: contains a NUL byte", path);
        else
            rc = sim_scenario_read_text(sc, buf, path, msg, msg_cap);
    }
    free(buf);
    return rc;
}

/* ---- finishing: devices and the generator ---------------------------------------- */

/* splitmix64: small, seedable, the same on every platform */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

static int64_t rng_between(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

typedef struct order {
    sim_job j;
    int seq;
} order;

static int cmp_order(const void *a, const void *b)
{
    const order *x = a, *y = b;
    if (x->j.at != y->j.at) return x->j.at < y->j.at ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int expand_devices(sim_scenario *sc, double scale, char *msg, size_t msg_cap)
{
    int64_t total = 0;
    for (int i = 0; i < sc->n_devspecs; i++) {
        int64_t n = llround(sc->devspecs[i].count * scale);
        total += n < 1 ? 1 : n;
    }
    sc->devices = calloc((size_t)(total ? total : 1), sizeof *sc->devices);
    if (!sc->devices) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int worker = 0;
    for (int i = 0; i < sc->n_devspecs; i++) {
        const sim_devspec *D = &sc->devspecs[i];
        int64_t n = llround(D->count * scale);
        if (n < 1) n = 1;
        for (int64_t k = 0; k < n; k++) {
            if (k > 0 && k % D->per_worker == 0) worker++;
            sc->devices[sc->n_devices++] =
                (sim_device){.worker = worker,
                             .host = D->host,
                             .kind = D->kind,
                             .speed = D->n_speeds ? D->speeds[k % D->per_worker] : D->speed,
                             .memory_bytes = D->memory_bytes};
        }
        worker++;
    }
    return 0;
}

static int generate(sim_scenario *sc, double scale, char *msg, size_t msg_cap)
{
    const sim_generator *g = &sc->gen;
    reader r = {.sc = sc, .file = "generator", .msg = msg, .cap = msg_cap};
    r.cap_jobs = sc->n_jobs;
    r.cap_keys = sc->n_keys;
    int target = (int)llround(g->jobs * scale);
    if (target < 1) target = 1;
    double rate = g->rate_per_s * scale, wsum = 0.0, t = g->start_s;
    for (int m = 0; m < sc->n_mixes; m++)
        wsum += sc->mixes[m].weight;
    uint64_t rng = g->seed;
    for (int made = 0, sub = 0; made < target; sub++) {
        t += -log(1.0 - rng_unit(&rng)) / rate;
        double pick = rng_unit(&rng) * wsum;
        int m = 0;
        while (m + 1 < sc->n_mixes && pick >= sc->mixes[m].weight)
            pick -= sc->mixes[m++].weight;
        const sim_mix *M = &sc->mixes[m];
        int n = (int)rng_between(&rng, M->sweep_min, M->sweep_max);
        int64_t steps = rng_between(&rng, M->steps_min, M->steps_max);
        int tenant = M->n_tenants ? M->tenants[rng_between(&rng, 0, M->n_tenants - 1)]
                                  : (int)rng_between(&rng, 0, sc->n_tenants - 1);
        char key[32];
        snprintf(key, sizeof key, "#gen%d", sub);
        int k = key_index(&r, key, M->profile);
        if (k < 0) return FB_ERR_NOMEM;
        for (int i = 0; i < n && made < target; i++, made++) {
            sim_job j = {.at = t,
                         .tenant = tenant,
                         .profile = M->profile,
                         .key = k,
                         .priority = M->priority,
                         .steps = steps};
            int rc = add_job(&r, &j);
            if (rc) return rc;
        }
    }
    return 0;
}

int sim_scenario_finish(sim_scenario *sc, double scale, char *msg, size_t msg_cap)
{
    if (sc->finished)
        return fb_errf(msg, msg_cap, FB_ERR_STATE_CONFLICT, "the scenario is already finished");
    if (!(scale > 0.0 && scale <= 1.0))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "scale %g is outside (0, 1]", scale);
    if (sc->n_devspecs == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the scenario has no devices record");
    if (sc->n_tenants == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the scenario has no tenant record");
    if (sc->gen.on && sc->n_mixes == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a generate record needs mix records");
    if (!sc->gen.on && sc->n_mixes > 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "mix records need a generate record");
    int rc = expand_devices(sc, scale, msg, msg_cap);
    if (rc) return rc;
    if (sc->gen.on && (rc = generate(sc, scale, msg, msg_cap))) return rc;
    if (sc->n_jobs == 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "the scenario has no jobs");
    order *o = malloc((size_t)sc->n_jobs * sizeof *o);
    if (!o) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < sc->n_jobs; i++)
        o[i] = (order){sc->jobs[i], i};
    qsort(o, (size_t)sc->n_jobs, sizeof *o, cmp_order);
    for (int i = 0; i < sc->n_jobs; i++)
        sc->jobs[i] = o[i].j;
    free(o);
    sc->finished = true;
    return 0;
}

void sim_scenario_free(sim_scenario *sc)
{
    if (!sc) return;
    for (int i = 0; i < sc->n_keys; i++)
        free(sc->keys[i]);
    for (int i = 0; i < sc->n_mixes; i++)
        free(sc->mixes[i].tenants);
    free(sc->keys);
    free(sc->key_profile);
    free(sc->profiles);
    free(sc->devices);
    free(sc->tenants);
    free(sc->hosts);
    free(sc->jobs);
    free(sc->devspecs);
    free(sc->mixes);
    memset(sc, 0, sizeof *sc);
}
