/*
 * The simulator's reports: a side-by-side table of runs with each run's
 * ratio to the first, and the same numbers as JSON.
 */
#include "sim.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct metric {
    const char *name; /* table row */
    const char *key;  /* JSON field */
    int digits;       /* decimals in the table */
    bool ratio;       /* print a ratio to the first run */
} metric;

static const metric METRICS[] = {
    {"makespan (s)", "makespan_s", 0, true},
    {"mean completion time (s)", "jct_mean_s", 0, true},
    {"median completion time (s)", "jct_p50_s", 0, true},
    {"p95 completion time (s)", "jct_p95_s", 0, true},
    {"max completion time (s)", "jct_max_s", 0, true},
    {"mean wait for placement (s)", "wait_mean_s", 0, true},
    {"max slowdown", "slowdown_max", 2, true},
    {"mean slowdown", "slowdown_mean", 2, true},
    {"p95 slowdown", "slowdown_p95", 2, true},
    {"device utilization", "utilization", 3, true},
    {"Jain's index of 1/slowdown", "jain", 3, true},
};
#define N_METRICS (int)(sizeof METRICS / sizeof METRICS[0])

static double value(const sim_result *r, int m)
{
    switch (m) {
    case 0:
        return r->makespan_s;
    case 1:
        return r->jct_mean;
    case 2:
        return r->jct_p50;
    case 3:
        return r->jct_p95;
    case 4:
        return r->jct_max;
    case 5:
        return r->wait_mean;
    case 6:
        return r->slow_max;
    case 7:
        return r->slow_mean;
    case 8:
        return r->slow_p95;
    case 9:
        return r->utilization;
    default:
        return r->jain;
    }
}

static void header(FILE *f, const sim_scenario *sc)
{
    int workers = sc->n_devices ? sc->devices[sc->n_devices - 1].worker + 1 : 0;
    fprintf(f, "scenario %s: %d devices on %d workers, %d tenants, %d profiles, %d jobs\n",
            sc->name, sc->n_devices, workers, sc->n_tenants, sc->n_profiles, sc->n_jobs);
}

void sim_report_table(FILE *f, const sim_scenario *sc, const sim_variant *v, int n)
{
    header(f, sc);
    const int w0 = 30, w = 16;
    fprintf(f, "%-*s", w0, "");
    for (int i = 0; i < n; i++)
        fprintf(f, "%*s", w, v[i].label);
    for (int i = 1; i < n; i++) {
        char h[64];
        snprintf(h, sizeof h, "%.9s/%.5s", v[i].label, v[0].label);
        fprintf(f, "%*s", w, h);
    }
    fprintf(f, "\n");
    fprintf(f, "%-*s", w0, "jobs finished");
    for (int i = 0; i < n; i++) {
        char c[32];
        snprintf(c, sizeof c, "%d/%d", v[i].r->n_done, v[i].r->n_jobs);
        fprintf(f, "%*s", w, c);
    }
    fprintf(f, "\n");
    for (int m = 0; m < N_METRICS; m++) {
        fprintf(f, "%-*s", w0, METRICS[m].name);
        for (int i = 0; i < n; i++)
            fprintf(f, "%*.*f", w, METRICS[m].digits, value(v[i].r, m));
        double base = value(v[0].r, m);
        for (int i = 1; i < n; i++) {
            char c[32] = "-";
            if (base > 0.0) {
                double x = value(v[i].r, m) / base;
                snprintf(c, sizeof c, "%.3f (%+.0f%%)", x, (x - 1.0) * 100.0);
            }
            fprintf(f, "%*s", w, c);
        }
        fprintf(f, "\n");
    }
    const char *counts[] = {"planner runs",  "rebalance periods", "split changes",
                            "share changes", "migrations",        "profiles measured"};
    for (int k = 0; k < 6; k++) {
        fprintf(f, "%-*s", w0, counts[k]);
        for (int i = 0; i < n; i++) {
            const sim_result *r = v[i].r;
            int64_t x = k == 0   ? r->n_plans
                        : k == 1 ? r->n_periods
                        : k == 2 ? r->n_split_changes
                        : k == 3 ? r->n_share_changes
                        : k == 4 ? r->n_migrations
                                 : r->n_profiles;
            fprintf(f, "%*lld", w, (long long)x);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "%-*s", w0, "wall time (s)");
    for (int i = 0; i < n; i++)
        fprintf(f, "%*.2f", w, v[i].wall_s);
    fprintf(f, "\n");
}

void sim_report_json(FILE *f, const sim_scenario *sc, const sim_variant *v, int n)
{
    json_t *root = json_object(), *runs = json_array();
    json_object_set_new(root, "scenario", json_string(sc->name));
    json_object_set_new(root, "devices", json_integer(sc->n_devices));
    json_object_set_new(root, "tenants", json_integer(sc->n_tenants));
    json_object_set_new(root, "jobs", json_integer(sc->n_jobs));
    for (int i = 0; i < n; i++) {
        const sim_result *r = v[i].r;
        json_t *o = json_object();
        json_object_set_new(o, "label", json_string(v[i].label));
        json_object_set_new(o, "jobs_done", json_integer(r->n_done));
        for (int m = 0; m < N_METRICS; m++)
            json_object_set_new(o, METRICS[m].key, json_real(value(r, m)));
        json_object_set_new(o, "planner_runs", json_integer(r->n_plans));
        json_object_set_new(o, "rebalance_periods", json_integer(r->n_periods));
        json_object_set_new(o, "split_changes", json_integer(r->n_split_changes));
        json_object_set_new(o, "share_changes", json_integer(r->n_share_changes));
        json_object_set_new(o, "migrations", json_integer(r->n_migrations));
        json_object_set_new(o, "profiles_measured", json_integer(r->n_profiles));
        json_object_set_new(o, "wall_s", json_real(v[i].wall_s));
        json_array_append_new(runs, o);
    }
    json_object_set_new(root, "runs", runs);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    if (text) fprintf(f, "%s\n", text);
    free(text);
    json_decref(root);
}

void sim_report_jobs(FILE *f, const sim_scenario *sc, const sim_result *r)
{
    fprintf(f, "%8s %-20s %-12s %8s %10s %10s %10s %9s\n", "job", "profile", "tenant", "steps",
            "submitted", "placed", "finished", "slowdown");
    for (int j = 0; j < sc->n_jobs; j++) {
        const sim_job *J = &sc->jobs[j];
        fprintf(f, "%8d %-20s %-12s %8lld %10.1f %10.1f %10.1f %9.3f\n", j,
                sc->profiles[J->profile].name, sc->tenants[J->tenant].name, (long long)J->steps,
                J->at, r->placed[j], r->finish[j], r->slowdown[j]);
    }
}
